import { create } from "@bufbuild/protobuf";
import {
  ConnectResponseSchema,
  DoneSchema,
  ErrorKind,
  OfferExpiredSchema,
  ReceiptSchema,
  type Receipt,
} from "../../gen/slotbroker/v1/broker_pb.js";
import { AbortReason } from "../shared/abort.js";
import type { Events } from "../shared/typed-events.js";
import { LogBudget, type Logger } from "../shared/log.js";
import { context } from "@opentelemetry/api";
import { withSpan, type Span } from "../shared/tracing/index.js";
import { endJobSpan, startJobTrace, type JobTrace } from "./job-trace.js";
import type { BrokerCore, CoreEffects, JobRecord, OfferOutcome } from "./broker-core.js";
import type { BuiltinService } from "./config.js";
import type { ExecserverEvents } from "./events.js";
import type { CheckedJob } from "./limits.js";
import { runJob as defaultRunJob, type RunJob } from "./runner/index.js";
import { OfferEncoder, encodeDone } from "./frames.js";
import { durationFromMs } from "@bufbuild/protobuf/wkt";

/** Options of the I/O side of the broker. */
export interface EffectsOptions {
  readonly instanceId: string;
  readonly offerTimeoutMs: number;
  /** SIGTERM → SIGKILL delay for a job stopped by a Cancel frame. */
  readonly cancelGraceMs: number;
  readonly logger: Logger;
  /** CA certificates for https pipe URLs (pipes.caFile); undefined: the system's. */
  readonly pipeCa?: Buffer;
  /** Runs command services; default: the process runner in ./runner. */
  readonly runJob: RunJob | undefined;
  /** Monotonic ms clock. */
  readonly now: () => number;
  /** Called after each finished job (drain waits on it). */
  readonly jobFinished: () => void;
  /** Where offers, their outcomes and jobs are told (metrics listen here). */
  readonly events: Events<ExecserverEvents>;
}

/**
 * The BrokerCore's hands: sends OFFER/DONE frames, keeps the one timer that drives offer
 * expiry, starts jobs (runner or built-in) and turns their receipts into finish() + DONE.
 * The OFFER is written before any bookkeeping, so metrics never sit on the grant path.
 */
export class BrokerIo implements CoreEffects {
  private broker: BrokerCore | undefined;
  private readonly offers: OfferEncoder;
  private expiryTimer: NodeJS.Timeout | undefined;
  private expiryAt = Infinity;
  private readonly badTraceLog = new LogBudget();

  constructor(private readonly options: EffectsOptions) {
    this.offers = new OfferEncoder(options.offerTimeoutMs);
  }

  /** Connects the core these effects serve (it is made after this). */
  attach(broker: BrokerCore): void {
    this.broker = broker;
  }

  /** @inheritdoc */
  offered(record: JobRecord): void {
    record.connection.sink.send(this.offers.encode(record.jobId, record.offerToken, record.group.name));
    if (record.expiresAt < this.expiryAt) this.armExpiry(record.expiresAt);
    this.options.events.emit("offered", record);
  }

  /** @inheritdoc */
  offerEnded(record: JobRecord, outcome: OfferOutcome, offerToken: string): void {
    // Without this frame a client whose offer lapsed could not tell its want is gone.
    if (outcome === "expired" && record.connection.state === "open") {
      const value = create(OfferExpiredSchema, { jobId: record.jobId, offerToken });
      record.connection.sink.send(create(ConnectResponseSchema, { frame: { case: "offerExpired", value } }));
    }
    this.options.events.emit("offer:ended", record, outcome);
  }

  /** Stops the expiry timer (server shutdown). */
  stop(): void {
    clearTimeout(this.expiryTimer);
    this.expiryTimer = undefined;
    this.expiryAt = Infinity;
  }

  // One timer for all offers, armed for the oldest; when it fires, everything due expires
  // and it is re-armed for the next. An offer accepted meanwhile costs nothing here.
  private armExpiry(at: number): void {
    clearTimeout(this.expiryTimer);
    this.expiryAt = at;
    this.expiryTimer = setTimeout(() => {
      this.expiryTimer = undefined;
      this.expiryAt = Infinity;
      this.guard("offer expiry", () => this.broker!.expireDue());
      // The head of the expiry list is the earliest; offers made during expireDue() may
      // have armed a later one.
      const next = this.broker!.nextExpiry();
      if (next !== undefined && next < this.expiryAt) this.armExpiry(next);
    }, Math.max(0, at - this.options.now()) + 1);
  }

  /** @inheritdoc */
  start(record: JobRecord, job: CheckedJob): void {
    this.options.events.emit("job:started", record);
    const traced = record.traceparent ? this.jobTrace(record) : undefined;
    const service = record.service;
    if (service.kind === "builtin") {
      // Built-ins finish at once and cannot be cancelled: no controller, no promise chain.
      queueMicrotask(() => this.guard("job finish", () => this.finished(record, builtins[service.builtin](), traced?.span, job)));
      return;
    }
    const controller = new AbortController();
    record.handle = controller;
    const run = this.options.runJob ?? defaultRunJob;
    run({
      command: service.command,
      args: job.args,
      env: traced ? { ...job.env, TRACEPARENT: traced.traceparent } : job.env,
      timeoutMs: job.timeoutMs,
      stdinUrl: job.stdinUrl,
      stdinInline: job.stdinInline,
      stdoutUrl: job.stdoutUrl,
      pipeCa: this.options.pipeCa,
      cancelGraceMs: this.options.cancelGraceMs,
      signal: controller.signal,
      onSpawn: (pid) => (record.jobPid = pid),
    })
      .catch((err: unknown) => failedReceipt(ErrorKind.SPAWN_FAILED, `runner failed: ${(err as Error)?.message ?? String(err)}`))
      .then((receipt) => this.guard("job finish", () => this.finished(record, receipt, traced?.span, job)))
      .catch(() => undefined);
  }

  /** @inheritdoc */
  cancel(record: JobRecord, why: "disconnected" | "requested"): void {
    const reason =
      why === "requested"
        ? new AbortReason("cancel-requested", "the fylr sent Cancel for this job")
        : new AbortReason("disconnected", "the connection that started the job is gone");
    this.options.events.emit("job:cancel", record, why);
    (record.handle as AbortController | undefined)?.abort(reason);
  }

  /** Aborts a running job because the server gives up on it (drain timeout). */
  abortForShutdown(record: JobRecord): void {
    (record.handle as AbortController | undefined)?.abort(new AbortReason("shutdown", "execserver shut down before the job finished"));
  }

  private finished(record: JobRecord, receipt: Receipt, span?: Span, job?: CheckedJob): void {
    this.broker!.finish(record);
    receipt.instanceId = this.options.instanceId;
    if (span) {
      endJobSpan(span, receipt, job?.stdinInline?.byteLength ?? 0);
      // The job's outcome is logged with its trace_id and span_id.
      context.with(withSpan(span), () => this.options.events.emit("job:done", record, receipt));
    } else this.options.events.emit("job:done", record, receipt);
    if (record.connection.state !== "closed") {
      const frame = encodeDone(record.jobId, receipt);
      if (frame) record.connection.sink.send(frame);
      else record.connection.sink.send(create(ConnectResponseSchema, { frame: { case: "done", value: create(DoneSchema, { jobId: record.jobId, receipt }) } }));
      record.connection.sink.jobFinished?.();
    }
    this.options.jobFinished();
  }

  // A malformed Job.traceparent is not the job's fault: it runs, untraced, and is logged.
  private jobTrace(record: JobRecord): JobTrace | undefined {
    const traced = startJobTrace(record, this.options.instanceId, this.options.now());
    if (traced !== "malformed") return traced;
    if (this.badTraceLog.take() !== undefined) {
      this.options.logger.warn({ jobId: record.jobId, traceparent: record.traceparent.slice(0, 80) }, "job.traceparent: not a W3C traceparent; the job runs untraced");
    }
    return undefined;
  }

  private guard(what: string, fn: () => void): void {
    try {
      fn();
    } catch (err) {
      this.options.logger.error({ err }, `${what} failed`);
    }
  }
}

/** In-process services: complete at once with a receipt, spawn nothing. */
export const builtins: Record<BuiltinService, () => Receipt> = {
  noop: () => create(ReceiptSchema, { exitCode: 0, duration: durationFromMs(0) }),
};

/** A receipt for a job the runner could not run at all. */
export function failedReceipt(error: ErrorKind, message: string): Receipt {
  return create(ReceiptSchema, { error, errorMessage: message, duration: durationFromMs(0) });
}
