/**
 * The items this fylr holds, each run by its own task: claimed → run (item-runner) →
 * outcome written (settle). Tracks what is held for admission and shutdown, and aborts
 * tasks directly (not through a signal linked to a parent: a linked child leaves a
 * listener on the parent for as long as the parent lives). Also when an exec item is
 * written 'running', and how a cancel reaches the task of an item held here.
 */
import { AbortReason, HookedAbortController, linkedAbortController, sleep } from "../../shared/abort.js";
import type { Events } from "../../shared/typed-events.js";
import { lazyChild, type Logger } from "../../shared/log.js";
import type { BlobStore } from "../blobs/blob-store.js";
import type { CompletionBatcher, RunningBatcher } from "../queue/group-commit.js";
import type { DispatcherConfig } from "../config.js";
import type { DispatcherEvents } from "../events.js";
import type { ExecBackend } from "./exec-backend.js";
import { runItem } from "./item-runner.js";
import { startItemTrace } from "./item-trace.js";
import type { LiveItems } from "./live.js";
import type { LocalActionRegistry } from "./local-actions.js";
import type { Permit } from "../claims/local-permits.js";
import { settle, type DispatcherCounters } from "./settle.js";
import type { QueueStore } from "../queue/queue-store.js";
import type { ClaimedItem } from "../types.js";
import type { ItemControlStore } from "../queue/item-control.js";

/** What the tasks are built from. */
export interface ItemTaskDeps {
  readonly queue: QueueStore;
  readonly completer: CompletionBatcher;
  /** Batches the claimed → running marks. */
  readonly starter: RunningBatcher;
  readonly backend: ExecBackend;
  readonly actions: LocalActionRegistry;
  readonly live: LiveItems;
  /** Stored inputs and outputs of any size. */
  readonly blobs: BlobStore;
  readonly config: DispatcherConfig;
  readonly counters: DispatcherCounters;
  readonly events: Events<DispatcherEvents>;
  readonly log: Logger;
  /** Aborted once the dispatcher stopped: outcome writes still retrying give up. */
  readonly writes: AbortSignal;
  /** Called after each task ended (the loop may claim again). */
  readonly finished: () => void;
}

/** The running item tasks of one dispatcher. */
export class ItemTasks {
  private readonly tasks = new Set<Promise<void>>();
  private readonly controllers = new Set<AbortController>();
  // The newest claim's controller per item id, for a cancel by id.
  private readonly byItem = new Map<string, { lease: number; controller: AbortController }>();
  private execCount = 0;

  constructor(private readonly deps: ItemTaskDeps) {}

  /** Tasks running now. */
  get size(): number {
    return this.tasks.size;
  }

  /** Exec items held now (claimed or running). */
  get execHeld(): number {
    return this.execCount;
  }

  /** Starts a task for a freshly claimed item (a local item brings its permit). */
  spawn(item: ClaimedItem, permit: Permit | undefined): void {
    this.deps.counters.claimed += 1;
    this.deps.events.emit("item:claimed", item);
    const task = this.run(item, permit).finally(() => {
      this.tasks.delete(task);
      this.deps.finished();
    });
    this.tasks.add(task);
  }

  /** Ids of the items held now. */
  heldIds(): string[] {
    return [...this.byItem.keys()];
  }

  /** Stops the task of item `id` on request (its job is cancelled at the execserver); false when not held here. */
  cancel(id: string): boolean {
    const held = this.byItem.get(id);
    if (!held || held.controller.signal.aborted) return held !== undefined;
    this.deps.events.emit("item:cancel-requested", id);
    held.controller.abort(new AbortReason("cancel-requested", "a cancel was asked for this item"));
    return true;
  }

  /** Aborts every running task with `reason`. */
  abortAll(reason: AbortReason): void {
    for (const controller of this.controllers) controller.abort(reason);
  }

  /** Waits up to `ms` (or until `cut` aborts) for the tasks to end; returns how many are left. */
  async settled(ms: number, cut?: AbortSignal): Promise<number> {
    const timeout = linkedAbortController(cut);
    await Promise.race([Promise.allSettled([...this.tasks]), sleep(ms, timeout.signal).catch(() => undefined)]);
    timeout.abort();
    return this.tasks.size;
  }

  private async run(item: ClaimedItem, permit: Permit | undefined): Promise<void> {
    const { queue, live, events } = this.deps;
    const traced = startItemTrace(item);
    const bindings = { itemId: item.id, lease: item.lease, kind: item.kind };
    const log = lazyChild(this.deps.log, traced ? { ...bindings, ...traced.logFields() } : bindings);
    const controller = new HookedAbortController();
    this.controllers.add(controller);
    this.byItem.set(item.id, { lease: item.lease, controller });
    live.add({ id: item.id, kind: item.kind, priority: item.priority, lease: item.lease, callCount: item.calls.length });
    // An exec item's place in the admission: given up by the task's end, or earlier by the
    // write of its success when that write claims the next items (group-commit.ts).
    let placeHeld = item.kind === "exec";
    if (placeHeld) this.execCount += 1;
    const freePlace = (): void => {
      if (placeHeld) this.execCount -= 1;
      placeHeld = false;
    };
    // Local items are claimed straight into 'running'. An exec item is written 'running' a
    // grace after its slot came (dispatcher.runningMarkDelay), unless its job is done by then
    // or its run was stopped meanwhile; item:started follows that write.
    let localStarted = false;
    const mark = new RunningMark(this.deps.config.runningMarkDelayMs, async () => {
      if (controller.signal.aborted) return;
      if (await this.markRunning(item, controller, log)) events.emit("item:started", item);
    });
    const onStart = (): void => {
      if (item.state === "claimed") return mark.started();
      if (!localStarted) events.emit("item:started", item);
      localStarted = true;
    };
    const { backend, actions, blobs, config, counters, completer } = this.deps;
    const runner = { backend, actions, live, blobs, inlineBytes: blobs.config.inlineBytes, maxOutputBytes: config.maxOutputBytes, onStart, trace: traced };
    try {
      permit?.markUsed();
      const outcome = await runItem(item, runner, controller.signal);
      if (outcome.kind !== "no-slot") for (const result of outcome.results) events.emit("call:done", item, result);
      await mark.finished();
      live.setPhase(item.id, item.lease, "finishing");
      const settleDeps = { queue, completer, config, counters, events, signal: this.deps.writes, freePlace: placeHeld ? freePlace : undefined, freePermit: permit ? () => permit.release() : undefined };
      if (traced) await traced.settle(outcome, () => settle(item, outcome, settleDeps, log));
      else await settle(item, outcome, settleDeps, log);
    } catch (err) {
      // A bug, not an outcome: give the item back rather than leave it claimed by a live fylr.
      log.error({ err }, "item task failed unexpectedly; giving the item back");
      await queue.release(item, 0).catch(() => undefined);
    } finally {
      traced?.end();
      void mark.finished();
      freePlace();
      permit?.release();
      live.remove(item.id, item.lease);
      this.controllers.delete(controller);
      if (this.byItem.get(item.id)?.controller === controller) this.byItem.delete(item.id);
    }
  }

  // False when the fence refused it (the run is aborted then).
  private async markRunning(item: ClaimedItem, controller: AbortController, log: Logger): Promise<boolean> {
    try {
      const ok = await this.deps.starter.markRunning({ id: item.id, claimedBy: item.claimedBy, lease: item.lease });
      if (ok) return true;
      if ((await this.deps.queue.get(item.id))?.state === "cancelled") {
        // Cancelled while its slot came: not an incident; the job is stopped at once.
        log.info("the item was cancelled as its job started; stopping it");
        this.cancel(item.id);
        return false;
      }
      this.deps.counters.fenced += 1;
      this.deps.events.emit("item:fenced", item);
      log.error({ incident: "lease-fenced" }, "mark running refused by the lease fence: the claim was taken back; aborting this run");
      controller.abort(new AbortReason("cancelled", "the claim was taken back (lease fenced)"));
      return false;
    } catch (err) {
      // Cosmetic: the item still completes from "claimed". Not worth failing the run over.
      log.warn({ err }, "could not mark the item running");
      return true;
    }
  }
}

// --- when an exec item is written 'running' ------------------------------------------
//
// When an exec item's claimed → running write happens. It is put off for a short grace
// after the job starts (dispatcher.runningMarkDelay): a job done within it is never written
// 'running' — its outcome goes from 'claimed' straight to the end state, saving a statement
// and the notification that statement sends to every fylr. A longer job is written
// 'running' once the grace has passed, and that write still checks the lease fence and a
// cancel early in a long run. Pure timing; the write itself is the caller's.

/** The running mark of one item. */
export class RunningMark {
  private timer: NodeJS.Timeout | undefined;
  private writing: Promise<void> | undefined;
  private ended = false;

  /** `write` is started at most once, after `delayMs` (at once for 0), unless the run ends first. */
  constructor(
    private readonly delayMs: number,
    private readonly write: () => Promise<void>,
  ) {}

  /** The job started (each call of a chain says so; only the first counts). */
  started(): void {
    if (this.ended || this.timer || this.writing) return;
    if (this.delayMs <= 0) {
      this.begin();
      return;
    }
    this.timer = setTimeout(() => {
      this.timer = undefined;
      if (!this.ended) this.begin();
    }, this.delayMs);
  }

  /** The run ended: a write not yet begun is skipped; one under way is waited for (the outcome must follow it). */
  async finished(): Promise<void> {
    this.ended = true;
    clearTimeout(this.timer);
    this.timer = undefined;
    await this.writing;
  }

  private begin(): void {
    this.writing = this.write();
  }
}

// --- cancels -------------------------------------------------------------------------
//
// Cancels reaching the items this fylr holds. A Cancel call on any fylr marks the row and
// notifies "cancel <id>"; the fylr holding the item stops its task at once (the exec
// client sends CANCEL to the execserver). Each heartbeat also looks the held items up, in
// case a notification was missed, and cancels items whose cancel is older than the
// bound (their fylr is gone, or never confirmed) — so no cancel waits forever.

/** What the cancel watch needs. */
export interface CancelWatchDeps {
  readonly control: ItemControlStore;
  readonly tasks: ItemTasks;
  readonly events: Events<DispatcherEvents>;
  readonly log: Logger;
  readonly cancelBoundMs: number;
}

/** Stops held items whose cancel was asked for. */
export class CancelWatch {
  constructor(private readonly deps: CancelWatchDeps) {}

  /** A cancel for `id` was asked (a notification, or a Cancel call on this fylr). */
  requested(id: string): void {
    if (this.deps.tasks.cancel(id)) this.deps.log.info({ itemId: id }, "cancel asked for a held item; stopping it");
  }

  /** The heartbeat's check: held items cancelled meanwhile, and overdue cancels anywhere. */
  async check(): Promise<void> {
    const held = this.deps.tasks.heldIds();
    for (const id of await this.deps.control.cancelledAmong(held)) this.requested(id);
    const overdue = await this.deps.control.cancelOverdue(this.deps.cancelBoundMs);
    if (overdue.length > 0) {
      this.deps.log.warn({ items: overdue, boundMs: this.deps.cancelBoundMs }, "cancelled items whose job was not confirmed stopped within the cancel bound");
    }
  }
}
