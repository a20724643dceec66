/**
 * The job's part of an item's trace. JOB carries the caller's traceparent; with traces on
 * here the job gets a span of its own (its child), and the job's process gets that span's
 * traceparent as TRACEPARENT, so a job that speaks OpenTelemetry continues the trace. With
 * traces off here the caller's traceparent is handed to the job as it came.
 */
import { ROOT_CONTEXT, trace } from "@opentelemetry/api";
import { ErrorKind, type Receipt } from "../../gen/slotbroker/v1/broker_pb.js";
import { SpanKind, SpanStatusCode, formatTraceparent, parseTraceparent, traceparentOf, tracer, tracing, type Span } from "../shared/tracing/index.js";
import type { JobRecord } from "./broker-records.js";

/** A traced job: its span (with traces on here) and the TRACEPARENT its process gets. */
export interface JobTrace {
  readonly span: Span | undefined;
  readonly traceparent: string;
}

/** The job's trace; undefined when JOB carried no traceparent, or "malformed" for one that is not well-formed (ignored). */
export function startJobTrace(record: JobRecord, instanceId: string, now: number): JobTrace | "malformed" | undefined {
  if (!record.traceparent) return undefined;
  const parent = parseTraceparent(record.traceparent);
  if (!parent) return "malformed";
  if (!tracing.on) return { span: undefined, traceparent: formatTraceparent(parent) };
  const span = tracer.startSpan(
    "slotbroker.job",
    {
      kind: SpanKind.SERVER,
      attributes: {
        "slotbroker.job.id": record.jobId,
        "slotbroker.service": record.service.name,
        "slotbroker.waitgroup": record.group.name,
        "slotbroker.execserver": instanceId,
        "slotbroker.connection": record.connection.clientName || record.connection.peerAddress,
        // From the WANT's arrival to this JOB: the want's time in the want-book and the offer's round trip.
        "slotbroker.slot_wait_ms": Math.max(0, Math.round(now - record.wantedAt)),
      },
    },
    trace.setSpanContext(ROOT_CONTEXT, parent),
  );
  return { span, traceparent: traceparentOf(span) ?? formatTraceparent(parent) };
}

/** Ends the job's span with what its receipt says. */
export function endJobSpan(span: Span, receipt: Receipt, stdinInlineBytes: number): void {
  span.setAttributes({
    "slotbroker.job.runtime_ms": receipt.duration ? Number(receipt.duration.seconds) * 1000 + Math.round(receipt.duration.nanos / 1e6) : 0,
    "slotbroker.job.stdout_bytes": Number(receipt.stdoutBytes),
    "slotbroker.job.stdout_streamed": receipt.stdoutStreamed,
    "slotbroker.job.stdin_inline_bytes": stdinInlineBytes,
  });
  if (receipt.exitCode !== undefined) span.setAttribute("process.exit.code", receipt.exitCode);
  if (receipt.signal) span.setAttribute("slotbroker.job.signal", receipt.signal);
  if (receipt.error !== ErrorKind.UNSPECIFIED) {
    span.setAttribute("error.type", ErrorKind[receipt.error] ?? String(receipt.error));
    span.setStatus({ code: SpanStatusCode.ERROR, message: receipt.errorMessage || ErrorKind[receipt.error] });
  } else if (receipt.exitCode !== 0) {
    span.setStatus({ code: SpanStatusCode.ERROR, message: receipt.signal ? `killed by ${receipt.signal}` : `exited with code ${receipt.exitCode ?? "?"}` });
  }
  span.end();
}
