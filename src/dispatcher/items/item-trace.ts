/**
 * An attempt's part of its item's trace, on the fylr that claimed it: the time queued
 * (from when the item became due to this claim), the claim span the attempt runs under,
 * one call span per exec call with its wait for a slot, and the settle. All continue the
 * item's stored Submit span; the call span's traceparent goes to the execserver in JOB.
 * Built only when traces are on and the item has a stored traceparent.
 */
import type { Position } from "../../../gen/slotbroker/v1/broker_pb.js";
import { SpanKind, SpanStatusCode, contextFrom, endFailed, traceparentOf, tracer, tracing, withSpan, type Context, type Span } from "../../shared/tracing/index.js";
import type { ExecResult } from "./exec-backend.js";
import type { Outcome } from "./item-runner.js";
import type { ClaimedItem, QueueItem } from "../types.js";

/** The claim of one attempt; undefined when traces are off or the item was submitted untraced. */
export function startItemTrace(item: ClaimedItem): ItemTrace | undefined {
  return tracing.on && item.traceparent ? new ItemTrace(item) : undefined;
}

/** The spans of one attempt on this fylr. */
export class ItemTrace {
  /** The claim span's context: the parent of the attempt's call spans. */
  readonly context: Context;
  private readonly claim: Span;

  constructor(item: ClaimedItem) {
    const parent = contextFrom(item.traceparent);
    const attributes = { "slotbroker.item.id": item.id, "slotbroker.attempt": item.attempts, "slotbroker.fylr": item.claimedBy };
    // Database times: queued from when the item became due (submit, retry backoff) until this claim.
    const claimedAt = item.claimedAt ?? new Date();
    const due = item.startAfter > item.createdAt ? item.startAfter : item.createdAt;
    if (due <= claimedAt) tracer.startSpan("slotbroker.queued", { attributes, startTime: due }, parent).end(claimedAt);
    this.claim = tracer.startSpan(
      "slotbroker.claim",
      { attributes: { ...attributes, "slotbroker.item.kind": item.kind, "slotbroker.lease": item.lease, "slotbroker.priority": item.priority } },
      parent,
    );
    this.context = withSpan(this.claim, parent);
  }

  /** The claim span's ids, bound to the task's logger so its lines carry the trace. */
  logFields(): { trace_id: string; span_id: string } {
    const { traceId, spanId } = this.claim.spanContext();
    return { trace_id: traceId, span_id: spanId };
  }

  /** Times the settle with its span, then ends the claim with the outcome. */
  async settle(outcome: Outcome, fn: () => Promise<void>): Promise<void> {
    const span = tracer.startSpan("slotbroker.settle", { attributes: { "slotbroker.outcome": outcome.kind } }, this.context);
    this.claim.setAttribute("slotbroker.outcome", outcome.kind);
    if (outcome.kind === "failed") this.claim.setStatus({ code: SpanStatusCode.ERROR, message: outcome.error });
    try {
      await fn();
      span.end();
    } catch (err) {
      endFailed(span, err instanceof Error ? err.message : String(err));
      throw err;
    }
  }

  /** Ends the claim span (once the attempt is over, settled or given back). */
  end(): void {
    this.claim.end();
  }
}

/**
 * One exec call: its span (the JOB's parent, so the execserver's job span is its child)
 * and, inside it, the wait for a slot from WANT to JOB with the waitgroup and the queue
 * positions reported meanwhile.
 */
export class CallTrace {
  private readonly call: Span;
  private wait: Span | undefined;
  /** Sent in JOB. */
  readonly traceparent: string | undefined;

  constructor(parent: Context, item: QueueItem, index: number, service: string) {
    this.call = tracer.startSpan(
      "slotbroker.call",
      { kind: SpanKind.CLIENT, attributes: { "slotbroker.item.id": item.id, "slotbroker.call": index, "slotbroker.service": service } },
      parent,
    );
    const inCall = withSpan(this.call, parent);
    this.wait = tracer.startSpan("slotbroker.slot_wait", { attributes: { "slotbroker.service": service } }, inCall);
    this.traceparent = traceparentOf(this.call);
  }

  /** A POSITION report while the want is parked. */
  position(position: Position): void {
    this.wait?.addEvent("position", { ahead: position.ahead, running: position.running, capacity: position.capacity });
    this.wait?.setAttributes({ "slotbroker.waitgroup": position.waitgroup, "slotbroker.queue.ahead": position.ahead });
  }

  /** The slot came and JOB went to `instanceId`. */
  started(instanceId: string, waitgroup: string | undefined): void {
    if (!this.wait) return;
    if (waitgroup) this.wait.setAttribute("slotbroker.waitgroup", waitgroup);
    this.wait.setAttribute("slotbroker.execserver", instanceId);
    this.wait.end();
    this.wait = undefined;
    this.call.setAttribute("slotbroker.execserver", instanceId);
  }

  /** The call ended with a receipt. */
  done(ran: ExecResult): void {
    const { receipt } = ran;
    this.wait?.end();
    if (receipt.exitCode !== undefined) this.call.setAttribute("process.exit.code", receipt.exitCode);
    this.call.setAttribute("slotbroker.job.stdout_bytes", Number(receipt.stdoutBytes));
    this.call.end();
  }

  /** The call ended without a receipt (no slot, connection lost, aborted). */
  failed(err: unknown): void {
    this.wait?.end();
    endFailed(this.call, err instanceof Error ? err.message : String(err));
  }
}
