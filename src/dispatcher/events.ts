/**
 * The dispatcher's lifecycle events (see Dispatcher.events). Status pages, metrics and
 * tests subscribe; nothing in the dispatcher depends on who listens.
 */
import type { LiveItem } from "./items/live.js";
import type { ReapResult } from "./queue/queue-store.js";
import type { CallResult, ClaimedItem, ItemState } from "./types.js";

/** The loop's lifecycle. */
export type DispatcherState = "idle" | "running" | "stopping" | "stopped";

/**
 * What woke the loop before its poll interval: a NOTIFY from any fylr ("notify"), a submit
 * through this dispatcher while it has no LISTEN connection (with one, the submit's own
 * NOTIFY wakes it) or a retry, an item of this fylr that finished, more work than one claim
 * batch, or a change of the exec capacity; "poll" when the interval passed.
 */
export type WakeSource = "notify" | "submit" | "finished" | "backlog" | "capacity" | "poll";

/** Why an item went back to the queue. */
export type RequeueReason = "retry" | "no-slot" | "given-back";

/** Event name → listener arguments. */
export interface DispatcherEvents {
  /** The lifecycle moved. */
  state: [state: DispatcherState, previous: DispatcherState];
  /** The loop woke up and starts a pass. */
  wakeup: [source: WakeSource];
  /** A loop pass ended; it claimed `claimed` items. */
  pass: [claimed: number];
  /** This fylr claimed an item (by a claim statement, or in the insert of its own submit). */
  "item:claimed": [item: ClaimedItem];
  /**
   * The item was written 'running': an exec item whose job still ran dispatcher.runningMarkDelay
   * after its first slot came (a job done sooner goes from claimed to its outcome without this
   * event; the live view's phase 'running', see item:changed, marks every job's start), or a
   * local item whose action began.
   */
  "item:started": [item: ClaimedItem];
  /** A held item changed in this fylr's live view (phase, position); `removed` once it let go. */
  "item:changed": [live: LiveItem, removed: boolean];
  /** The item's success was written. */
  "item:succeeded": [item: ClaimedItem];
  /** The item failed for good (no attempts left, or a permanent failure). */
  "item:failed": [item: ClaimedItem, error: string];
  /** The item ended cancelled by this fylr (its job stopped on request), or its cancel reached this fylr's task. */
  "item:cancelled": [item: ClaimedItem];
  /** One exec call of an item this fylr ran has ended (its receipt, and its timing when it got a slot). */
  "call:done": [item: ClaimedItem, result: CallResult];
  /** A Cancel through this fylr changed an item that was in state `previous`. */
  "cancel:asked": [previous: ItemState];
  /** A cancel was asked for an item this fylr holds: its task is being stopped. */
  "item:cancel-requested": [itemId: string];
  /** The item went back to the queue. */
  "item:requeued": [item: ClaimedItem, reason: RequeueReason];
  /** The lease fence refused this fylr's write: the item was taken back meanwhile. */
  "item:fenced": [item: ClaimedItem];
  /** This fylr's heartbeat was written; `alive` false when a sibling had declared it dead. */
  heartbeat: [alive: boolean];
  /** A sweep found fylrs with stale heartbeats and requeued (or failed) their claims. */
  "orphans:rescued": [result: ReapResult];
  /** A notification said this item's state changed (on any fylr). */
  "queue:changed": [itemId: string];
  /** LISTEN is in place (again); notifications sent before may have been missed. */
  "notify:up": [];
  /** The LISTEN connection failed; it reconnects, and the polls carry on meanwhile. */
  "notify:down": [error: Error];
}
