/**
 * Writing an attempt's outcome: the fenced queue-store call for each Outcome, retried
 * through short database outages, with the counters and log lines that go with it. A write
 * the fence refuses means the item was requeued and maybe claimed again while this fylr
 * still ran it — the work ran twice — so it is logged at error level as an incident and
 * dropped.
 */
import { AbortReason } from "../../shared/abort.js";
import type { Events } from "../../shared/typed-events.js";
import type { Logger } from "../../shared/log.js";
import { retry, retryDelayMs, type RetryPolicy } from "../../shared/retry.js";
import type { DispatcherConfig } from "../config.js";
import type { CompletionBatcher } from "../queue/group-commit.js";
import type { DispatcherEvents } from "../events.js";
import type { Outcome } from "./item-runner.js";
import { isTransient } from "../queue/pg-errors.js";
import type { QueueStore } from "../queue/queue-store.js";
import { describeFailure } from "./item-runner.js";
import type { CallResult, ClaimedItem, Fence } from "../types.js";

/** Running totals since start, for Stats and metrics. */
export interface DispatcherCounters {
  claimed: number;
  /** Of those, submits through this fylr claimed in their own insert (no claim statement). */
  claimedDirectly: number;
  succeeded: number;
  failed: number;
  /** Back to the queue: retry after a failed attempt, no slot in time, given back on stop. */
  requeued: number;
  /** Stale claims of dead siblings this fylr requeued or failed. */
  orphansRescued: number;
  /** Writes refused by the lease fence. */
  fenced: number;
  /** Items this fylr stopped on request and wrote as cancelled. */
  cancelled: number;
  /** Finished rows this fylr deleted after the queue's retention (queue.retention). */
  finishedDeleted: number;
  /** Loop passes run (a liveness figure: it grows about once per poll interval). */
  passes: number;
}

/** A fresh set of zeroed counters. */
export function newCounters(): DispatcherCounters {
  return { claimed: 0, claimedDirectly: 0, succeeded: 0, failed: 0, requeued: 0, orphansRescued: 0, fenced: 0, cancelled: 0, finishedDeleted: 0, passes: 0 };
}

/** What settling needs. */
export interface SettleDeps {
  readonly queue: QueueStore;
  /** Successes go through it, batched with other items finishing at the same time. */
  readonly completer: CompletionBatcher;
  readonly config: DispatcherConfig;
  readonly counters: DispatcherCounters;
  readonly events: Events<DispatcherEvents>;
  /** Aborted when the dispatcher has stopped: writes are no longer retried. */
  readonly signal: AbortSignal;
  /** An exec item's: gives up its admission place (a success write that claims calls it). */
  readonly freePlace?: () => void;
  /** A local item's: gives its permit back (a success write that claims calls it). */
  readonly freePermit?: () => void;
}

/** Records one attempt's outcome in the database. Never rejects. */
export async function settle(item: ClaimedItem, outcome: Outcome, deps: SettleDeps, log: Logger): Promise<void> {
  const fence: Fence = { id: item.id, claimedBy: item.claimedBy, lease: item.lease };
  const { queue, config, counters, events } = deps;
  try {
    switch (outcome.kind) {
      case "succeeded": {
        const ok = await retrying(deps, log, "complete", () => deps.completer.complete(fence, outcome.results, outcome.output, deps.freePlace, deps.freePermit));
        if (!ok) return await refused(item, deps, log, "completion", outcome.results);
        counters.succeeded += 1;
        events.emit("item:succeeded", item);
        // debug: a busy fylr finishes thousands a second; failures and requeues are the news.
        log.debug({ attempts: item.attempts, outputBytes: outcome.output.size }, "item succeeded");
        return;
      }
      case "failed": {
        const delayMs = itemRetryDelayMs(config, item.attempts);
        const state = await retrying(deps, log, "fail attempt", () =>
          queue.failAttempt(fence, outcome.results, outcome.error, delayMs, outcome.permanent),
        );
        if (state === undefined) return await refused(item, deps, log, "failure", outcome.results);
        if (state === "cancelled") {
          // A cancel was asked for while the attempt ran: it ends here, never retried.
          counters.cancelled += 1;
          events.emit("item:cancelled", item);
          log.info({ error: outcome.error }, "attempt failed with a cancel pending; item cancelled");
          return;
        }
        if (state === "queued") {
          counters.requeued += 1;
          events.emit("item:requeued", item, "retry");
          log.warn({ attempts: item.attempts, maxAttempts: item.maxAttempts, retryInMs: delayMs, error: outcome.error }, "attempt failed; will retry");
        } else {
          counters.failed += 1;
          events.emit("item:failed", item, outcome.error);
          log.warn({ attempts: item.attempts, permanent: outcome.permanent, error: outcome.error }, "item failed");
        }
        return;
      }
      case "no-slot": {
        const ok = await retrying(deps, log, "release", () => queue.release(fence, config.noSlotDelayMs));
        if (!ok) return await refused(item, deps, log, "no-slot requeue");
        counters.requeued += 1;
        events.emit("item:requeued", item, "no-slot");
        // Expected under load and not a fault: info, not a warning.
        log.info({ delayMs: config.noSlotDelayMs, reason: outcome.error.message }, "no slot in time; requeued with the attempt given back");
        return;
      }
      case "aborted":
        if (outcome.reason instanceof AbortReason && outcome.reason.kind === "cancel-requested") {
          return await cancelled(item, fence, outcome.results, deps, log);
        }
        return await givenUp(item, fence, outcome.reason, deps, log);
    }
  } catch (err) {
    // The write kept failing; the claim stays ours until this fylr stops or dies, and then
    // a sibling's sweep requeues it.
    log.error({ err, outcome: outcome.kind }, "could not record the outcome; the item stays claimed until this fylr is gone");
  }
}

// Stopped on request: cancelled, with the receipts of the calls that ran (the stopped one's
// says CANCEL_REQUESTED). A queued or claimed item was cancelled by the Cancel call itself,
// so the fence refusing this write is expected, not an incident.
async function cancelled(item: ClaimedItem, fence: Fence, results: readonly CallResult[], deps: SettleDeps, log: Logger): Promise<void> {
  const ok = await retrying(deps, log, "finish cancelled", () => deps.queue.finishCancelled(fence, results, cancelError(results)));
  if (ok) deps.counters.cancelled += 1;
  deps.events.emit("item:cancelled", item);
  log.info({ written: ok, calls: results.length }, ok ? "item cancelled on request" : "item was already cancelled (a Cancel ends a claimed item at once)");
}

function cancelError(results: readonly CallResult[]): string {
  const last = results[results.length - 1];
  return last ? `cancelled by request; ${last.service} ${describeFailure(last.receipt)}` : "cancelled by request";
}

async function givenUp(item: ClaimedItem, fence: Fence, reason: unknown, deps: SettleDeps, log: Logger): Promise<void> {
  const kind = reason instanceof AbortReason ? reason.kind : "cancelled";
  if (kind === "shutdown" || kind === "disconnected") {
    // Stopping, or declared dead: give it back now. After a sweep already requeued it the
    // fence refuses this, which is expected here and not an incident.
    const ok = await retrying(deps, log, "release", () => deps.queue.release(fence, 0));
    if (ok) {
      deps.counters.requeued += 1;
      deps.events.emit("item:requeued", item, "given-back");
    }
    log.info({ given: ok, reason: kind, attempts: item.attempts }, ok ? "gave the item back to the queue" : "item was already taken back");
    return;
  }
  log.warn({ reason: String(reason) }, "item run abandoned without a write");
}

async function refused(item: ClaimedItem, deps: SettleDeps, log: Logger, what: string, results: readonly CallResult[] = []): Promise<void> {
  // A Cancel call ends a claimed item at once, also one whose job already ran but was not
  // yet written 'running' (dispatcher.runningMarkDelay): the cancel won, no incident. The
  // job's receipts are kept with it, as for a running item's cancel.
  const now = await deps.queue.get(item.id).catch(() => undefined);
  if (now?.state === "cancelled" && now.claimedBy === item.claimedBy && now.lease === item.lease) {
    const fence: Fence = { id: item.id, claimedBy: item.claimedBy, lease: item.lease };
    const kept = results.length > 0 && (await deps.queue.finishCancelled(fence, results, cancelError(results)).catch(() => false));
    deps.events.emit("item:cancelled", item);
    log.info({ receiptsKept: kept }, `${what} dropped: the item was cancelled while its job ran, before it was written running`);
    return;
  }
  deps.counters.fenced += 1;
  deps.events.emit("item:fenced", item);
  log.error({ incident: "lease-fenced" }, `${what} refused by the lease fence: the item was requeued after this fylr's heartbeat went stale, and may have run twice`);
}

/** Before the item's next attempt: retryInitial · 2^(attempts − 1), capped at retryMax. */
export function itemRetryDelayMs(config: Pick<DispatcherConfig, "retryInitialMs" | "retryMaxMs">, attempts: number): number {
  return retryDelayMs({ initialMs: config.retryInitialMs, maxMs: config.retryMaxMs }, attempts - 1);
}

// Outcome writes ride out short database outages: 200 ms doubling to 5 s, 30 attempts.
const writePolicy: RetryPolicy = { initialMs: 200, maxMs: 5000 };

function retrying<T>(deps: SettleDeps, log: Logger, what: string, write: () => Promise<T>): Promise<T> {
  return retry(write, {
    policy: writePolicy,
    maxAttempts: 30,
    retryable: isTransient,
    signal: deps.signal,
    onRetry: (err, attempt, retryInMs) => log.warn({ err, attempt, retryInMs }, `${what} failed; retrying`),
  });
}
