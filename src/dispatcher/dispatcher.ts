/**
 * The dispatcher: one per fylr. Its claim loop wakes on a NOTIFY from any fylr (an item
 * was queued), right after one of its items finished, when the capacity changed, and at
 * the latest every poll interval; each pass claims what admission allows — exec items up
 * to its share of the exec capacity it sees, local items up to free permits — handing
 * each item to its own task. The heartbeat and the sweeps run on a loop of their own
 * (housekeeping.ts).
 */
import { randomUUID } from "node:crypto";
import { hostname } from "node:os";
import pg from "pg";
import { AbortReason, sleep } from "../shared/abort.js";
import { Code, SlotbrokerError } from "../shared/errors.js";
import { Events } from "../shared/typed-events.js";
import { IllegalTransitionError, Transitions } from "../shared/lifecycle.js";
import { silentLogger, type Logger } from "../shared/log.js";
import { createPgPool } from "../shared/postgres.js";
import { storeConfig, type StoreConfig } from "./blobs/store-config.js";
import { BlobStore } from "./blobs/blob-store.js";
import type { InstanceShare } from "./claims/admission.js";
import type { CapacitySource } from "./claims/capacity.js";
import { ClaimPass } from "./claims/claim-pass.js";
import { runHousekeeping } from "./claims/housekeeping.js";
import { LocalPermits } from "./claims/local-permits.js";
import { QueueListener } from "./claims/queue-listener.js";
import { Wakeup } from "./claims/wakeup.js";
import { refusesWrites, WriteHealth, writeHealthMaxAgeMs } from "./claims/write-health.js";
import { dispatcherConfig, effectiveLocalSlots, type DispatcherConfig } from "./config.js";
import type { DispatcherEvents, DispatcherState } from "./events.js";
import type { ExecBackend } from "./items/exec-backend.js";
import { CancelWatch, ItemTasks } from "./items/item-tasks.js";
import { ItemFollowers, LiveItems, type LiveItem } from "./items/live.js";
import { createDefaultActions, type LocalActionRegistry } from "./items/local-actions.js";
import { newCounters, type DispatcherCounters } from "./items/settle.js";
import { CompletionBatcher, RunningBatcher, SubmitBatcher } from "./queue/group-commit.js";
import { ItemControlStore, type CancelResult, type ItemPage } from "./queue/item-control.js";
import type { ListFilter } from "./queue/item-list.js";
import { migrate } from "./queue/migrate.js";
import { normalizeSubmit } from "./queue/payload.js";
import { queueConfig, type QueueConfig } from "./queue/queue-config.js";
import { QueueStore, type FylrRegistration, type StoredPosition } from "./queue/queue-store.js";
import type { ItemHistory, QueueItem, SubmitInput } from "./types.js";

export type { DispatcherState };

const transitions = new Transitions<DispatcherState>("dispatcher", {
  idle: ["running", "stopped"],
  running: ["stopping"],
  stopping: ["stopped"],
  stopped: [],
});

const forceTimeoutMs = 5000;
// Claim statements started by queued-item wakeups go out at most this often: a burst of
// submits across the fleet wakes every fylr once per notification, and one claim takes
// them all. Measured from the last claim statement, not the last pass: a pass that asked
// nothing (the queue known drained) must not delay a lone submit's claim.
const queuedWakeGapMs = 10;

/** Everything a dispatcher is built from. */
export interface DispatcherOptions {
  readonly pool: pg.Pool;
  readonly capacity: CapacitySource;
  readonly backend: ExecBackend;
  /** Default: the built-in actions (checksum, count). */
  readonly actions?: LocalActionRegistry;
  /** Compiled config; missing keys take the defaults. */
  readonly config?: Partial<DispatcherConfig>;
  /** The store for inputs and outputs of any size; missing keys take the defaults. */
  readonly store?: Partial<StoreConfig>;
  /** The queue table's retention of finished rows; missing keys take the defaults. */
  readonly queue?: Partial<QueueConfig>;
  /**
   * Connections for streaming stored data (long transactions); default `pool`. A fylr
   * gives it a pool of its own so uploads never starve heartbeats and claims.
   */
  readonly blobPool?: pg.Pool;
  readonly logger?: Logger;
  /** This fylr's id in the `fylrs` table; default a random UUID. */
  readonly fylrId?: string;
  /** This fylr's QueueService URL, recorded for operators. */
  readonly apiUrl?: string;
  /** Apply pending migrations in start() (default true). */
  readonly migrate?: boolean;
  /** Makes the LISTEN connection's client (default: a pg.Client with the pool's settings). */
  readonly listenClient?: () => pg.Client;
}

/** A snapshot for QueueService.Stats. */
export interface DispatcherStats {
  readonly fylrId: string;
  readonly state: DispatcherState;
  readonly execHeld: number;
  readonly execAdmission: number;
  readonly shares: readonly InstanceShare[];
  readonly localRunning: number;
  readonly localCapacity: number;
  readonly localReservedForHigh: number;
  readonly counters: Readonly<DispatcherCounters>;
}

/** An item's place in line as this fylr knows it: the database's count plus its own live view. */
export interface ItemPosition extends StoredPosition {
  /** Present while this fylr holds the item. */
  readonly live: LiveItem | undefined;
}

/** Running items did not end within the force timeout after being aborted. */
export class DispatcherStopTimeoutError extends SlotbrokerError {
  override name = "DispatcherStopTimeoutError";
  constructor(left: number, waitedMs: number) {
    super(Code.DeadlineExceeded, `${left} item task(s) still running ${waitedMs} ms after being aborted`);
  }
}

/** The Postgres dispatcher of one fylr. */
export class Dispatcher {
  /** The queue store: typed calls over queue_items and fylrs. */
  readonly queue: QueueStore;
  /** Cancel, list, retry and delete. */
  readonly control: ItemControlStore;
  /** Stored inputs and outputs: every fylr of the queue reads what any wrote. */
  readonly blobs: BlobStore;
  readonly config: DispatcherConfig;
  /** The retention of finished rows (the `queue:` section). */
  readonly queueConfig: QueueConfig;
  readonly fylrId: string;
  /** Lifecycle events: claims, starts, outcomes, requeues, wakeups, passes, state. */
  readonly events: Events<DispatcherEvents>;
  private readonly log: Logger;
  private readonly actions: LocalActionRegistry;
  private readonly permits: LocalPermits;
  private readonly live: LiveItems;
  private readonly tasks: ItemTasks;
  private readonly counters = newCounters();
  private readonly wakeup = new Wakeup();
  private readonly claims: ClaimPass;
  private readonly submits: SubmitBatcher;
  private readonly loopAbort = new AbortController();
  // The housekeeping loop stops last: it heartbeats while running items finish.
  private readonly housekeepingAbort = new AbortController();
  // Aborted once stopped: outcome writes still retrying give up.
  private readonly writesAbort = new AbortController();
  // Aborted by a stop({ graceMs: 0 }) that arrives while a graceful stop is waiting.
  private readonly graceCut = new AbortController();
  private currentState: DispatcherState = "idle";
  private loopDone: Promise<void> = Promise.resolve();
  private housekeepingDone: Promise<void> = Promise.resolve();
  private heartbeatPool: pg.Pool | undefined;
  private stopping: Promise<void> | undefined;
  private unsubscribeCapacity: () => void = () => undefined;
  private listener: QueueListener | undefined;
  private readonly followers: ItemFollowers;
  private readonly cancels: CancelWatch;
  private readonly writes: WriteHealth;

  constructor(private readonly options: DispatcherOptions) {
    this.config = dispatcherConfig(options.config);
    this.queueConfig = queueConfig(options.queue);
    this.queue = new QueueStore(options.pool);
    this.submits = new SubmitBatcher(this.queue);
    this.control = new ItemControlStore(options.pool);
    this.fylrId = options.fylrId ?? randomUUID();
    this.blobs = new BlobStore(options.blobPool ?? options.pool, storeConfig(options.store), this.fylrId, options.pool);
    this.actions = options.actions ?? createDefaultActions();
    this.permits = new LocalPermits(effectiveLocalSlots(this.config));
    this.log = (options.logger ?? silentLogger).child({ component: "dispatcher", fylrId: this.fylrId });
    this.events = new Events((err, event) => this.log.error({ err, event }, "a dispatcher event listener threw"));
    this.followers = new ItemFollowers((err, itemId) => this.log.error({ err, itemId }, "an item follower threw"));
    this.live = new LiveItems((item, removed) => {
      this.events.emit("item:changed", item, removed);
      this.followers.wake(item.id);
    });
    this.events.on("queue:changed", (id) => this.followers.wake(id));
    // After a reconnect every follower looks again: a notification may have been missed.
    this.events.on("notify:up", () => this.followers.wakeAll());
    const completer = new CompletionBatcher(this.queue);
    this.tasks = new ItemTasks({
      queue: this.queue,
      completer,
      starter: new RunningBatcher(this.queue),
      backend: options.backend,
      actions: this.actions,
      live: this.live,
      blobs: this.blobs,
      config: this.config,
      counters: this.counters,
      events: this.events,
      log: this.log,
      writes: this.writesAbort.signal,
      finished: () => this.wakeup.notify("finished"),
    });
    this.claims = new ClaimPass({
      queue: this.queue,
      tasks: this.tasks,
      permits: this.permits,
      capacity: options.capacity,
      config: this.config,
      counters: this.counters,
      events: this.events,
      wakeup: this.wakeup,
      log: this.log,
      fylrId: this.fylrId,
      listening: () => this.listening,
      running: () => this.currentState === "running",
    });
    completer.rider = this.claims;
    this.cancels = new CancelWatch({ control: this.control, tasks: this.tasks, events: this.events, log: this.log, cancelBoundMs: this.config.cancelBoundMs });
    this.writes = new WriteHealth(writeHealthMaxAgeMs(this.config.heartbeatIntervalMs), performance.now());
  }

  /** Whether the database takes this fylr's writes (heartbeat, refused writes), for readiness. */
  databaseWritable(): { readonly ok: boolean; readonly detail: string } {
    return this.writes.report(performance.now());
  }

  /** A write failed: one the database refused (disk full, read-only, no privilege) fails readiness for a while. */
  noteWriteError(err: unknown): void {
    if (refusesWrites(err)) this.writes.refused(err, performance.now());
  }

  /** The lifecycle state. */
  get state(): DispatcherState {
    return this.currentState;
  }

  private setState(next: DispatcherState): void {
    const previous = this.currentState;
    this.currentState = transitions.check(previous, next);
    this.events.emit("state", next, previous);
  }

  /** Migrates (unless disabled), registers this fylr and starts the loop. Aborting `signal` stops it. */
  async start(signal?: AbortSignal): Promise<void> {
    if (this.currentState !== "idle") throw new IllegalTransitionError("dispatcher", this.currentState, "running");
    if (this.options.migrate !== false) await migrate(this.options.pool, { logger: this.log });
    await this.blobs.room.checkDiskPath();
    await this.queue.registerFylr(this.registration());
    this.writes.wrote(performance.now());
    this.claims.localNotifies = await this.queue.hasMigration(7);
    this.setState("running");
    this.unsubscribeCapacity = this.options.capacity.subscribe(() => this.wakeup.notify("capacity"));
    if (this.config.listen) this.listen();
    this.loopDone = this.loop();
    // One connection of its own: a heartbeat queued behind a burst of submits and writes
    // in the shared pool can miss the stale threshold, and siblings take over live work.
    this.heartbeatPool = createPgPool({ ...this.options.pool.options, max: 1, application_name: `slotbroker-heartbeat ${this.fylrId}` }, (err) =>
      this.log.debug({ err: err.message }, "idle heartbeat connection failed"),
    );
    this.housekeepingDone = this.housekeeping(new QueueStore(this.heartbeatPool));
    this.log.info({ localSlots: this.permits.capacity, headroom: this.config.headroom }, "dispatcher started");
    const stopOnAbort = (): void => void this.stop().catch((err: unknown) => this.log.error({ err }, "stop failed"));
    if (signal?.aborted) stopOnAbort();
    else signal?.addEventListener("abort", stopOnAbort, { once: true });
  }

  /**
   * Stops claiming, lets running items finish within `graceMs` (default config.stopGraceMs),
   * then aborts the rest and gives them back to the queue, and removes this fylr's row.
   * Idempotent: every call returns the same promise; a later call with `graceMs: 0` cuts a
   * running grace period short (the forceful stop after a graceful one).
   */
  stop(options: { graceMs?: number } = {}): Promise<void> {
    if (this.currentState === "idle") this.setState("stopped");
    if (this.currentState === "stopped" && !this.stopping) return Promise.resolve();
    if (this.stopping && options.graceMs === 0) this.graceCut.abort();
    this.stopping ??= this.shutdown(options.graceMs ?? this.config.stopGraceMs);
    return this.stopping;
  }

  private async shutdown(graceMs: number): Promise<void> {
    this.setState("stopping");
    this.unsubscribeCapacity();
    this.loopAbort.abort(new AbortReason("shutdown", "dispatcher stopping"));
    await this.loopDone;
    await this.listener?.close();
    let left = await this.tasks.settled(graceMs, this.graceCut.signal);
    if (left > 0) {
      this.log.warn({ left, graceMs }, "items still running after the grace period; aborting and giving them back");
      this.tasks.abortAll(new AbortReason("shutdown", "dispatcher stopped before the item finished"));
      left = await this.tasks.settled(forceTimeoutMs);
    }
    // Claims that landed as the stop began (a claim along a last success, a submit claimed
    // in its insert) go back to the queue before this fylr's row does.
    if (!(await this.claims.settled(forceTimeoutMs))) this.log.warn({ timeoutMs: forceTimeoutMs }, "claims that landed during the stop were not all given back in time; a sibling's sweep requeues them");
    this.housekeepingAbort.abort(new AbortReason("shutdown", "dispatcher stopping"));
    await this.housekeepingDone;
    await this.heartbeatPool?.end().catch((err: unknown) => this.log.debug({ err }, "closing the heartbeat connection failed"));
    try {
      await this.queue.deregisterFylr(this.fylrId);
    } catch (err) {
      // Our row goes stale instead and siblings sweep our claims after the threshold.
      this.log.warn({ err }, "could not remove this fylr's row");
    }
    this.setState("stopped");
    this.writesAbort.abort(new AbortReason("shutdown", "dispatcher stopped"));
    this.log.info(this.counters, "dispatcher stopped");
    if (left > 0) throw new DispatcherStopTimeoutError(left, forceTimeoutMs);
  }

  /**
   * Validates and enqueues an item (or returns the one holding its idempotency key). When
   * this fylr knows the exec queue drained and has a free exec place, the insert claims the
   * item for it and its task starts right after the caller's continuation: no notification,
   * no claim statement. Other submits are queued, grouped while an insert is on its way.
   */
  async submit(input: SubmitInput): Promise<{ item: QueueItem; created: boolean }> {
    const { maxInputBytes, maxAttempts: defaultMaxAttempts, stdinUrlPrefixes } = this.config;
    const normalized = normalizeSubmit(input, this.actions, { maxInputBytes, defaultMaxAttempts, stdinUrlPrefixes });
    let place = this.currentState === "running" ? this.claims.reserveDirect(normalized) : undefined;
    try {
      const result = place ? await this.queue.submit(normalized, this.fylrId) : await this.submits.submit(normalized);
      if (result.created && result.item.state === "claimed") {
        this.claims.startDirectly(result.item, () => this.currentState === "running", place);
        place = undefined; // held until the task holds it
      } else if (result.created) this.claims.queuedHere(result.item.kind);
      // With LISTEN up the insert's own notification wakes this loop (a second wake cost an empty pass).
      if (result.created && !this.listening) this.wakeup.notify("submit");
      return result;
    } catch (err) {
      this.noteWriteError(err);
      throw err;
    } finally {
      place?.();
    }
  }

  /**
   * Cancels an item (see ItemControlStore.cancel). When this fylr holds it, its task stops
   * at once; otherwise the holder hears of it by notification (or its heartbeat's check).
   */
  async cancel(id: string): Promise<CancelResult> {
    const result = await this.control.cancel(id);
    if (result.previous !== "cancelled") this.events.emit("cancel:asked", result.previous);
    if (result.previous === "claimed" || result.previous === "running") this.cancels.requested(id);
    return result;
  }

  /** A page of items, newest first. */
  list(filter: ListFilter): Promise<ItemPage> {
    return this.control.list(filter);
  }

  /** A failed or cancelled item back to the queue with fresh attempts. */
  async retry(id: string): Promise<QueueItem> {
    const item = await this.control.retry(id);
    this.claims.maybeQueued();
    this.wakeup.notify("submit");
    return item;
  }

  /** Removes a finished item and its stored data. */
  delete(id: string): Promise<{ blobs: number }> {
    return this.control.delete(id);
  }

  /** An item's timeline (see ItemControlStore.history). */
  history(id: string): Promise<ItemHistory> {
    return this.control.history(id);
  }

  /** An item from the database, or undefined. */
  get(id: string): Promise<QueueItem | undefined> {
    return this.queue.get(id);
  }

  /** Where an item stands: the database count ahead of it, plus this fylr's live view. */
  async position(id: string): Promise<ItemPosition | undefined> {
    const stored = await this.queue.position(id);
    return stored && { ...stored, live: this.live.get(id) };
  }

  /** This fylr's in-memory view of an item it holds. */
  liveItem(id: string): LiveItem | undefined {
    return this.live.get(id);
  }

  /**
   * Calls `wake` whenever item `id` may have changed: in this fylr's live view, or on any
   * fylr (a notification). Returns the function that stops it.
   */
  followItem(id: string, wake: () => void): () => void {
    return this.followers.add(id, wake);
  }

  /** Asks for an extra loop pass soon (as a notification from another fylr would). */
  poke(): void {
    this.claims.maybeQueued();
    this.wakeup.notify("notify");
  }

  /** A snapshot of admission, holdings and counters. */
  stats(): DispatcherStats {
    const permits = this.permits.counts();
    return {
      fylrId: this.fylrId,
      state: this.currentState,
      execHeld: this.tasks.execHeld,
      execAdmission: this.claims.admission.admission,
      shares: this.claims.admission.shares,
      localRunning: permits.held,
      localCapacity: permits.capacity,
      localReservedForHigh: permits.reservedForHigh,
      counters: { ...this.counters },
    };
  }

  /** True while the LISTEN connection is in place (wakeups arrive within milliseconds). */
  get listening(): boolean {
    return this.listener?.up ?? false;
  }

  // Wakeups from every fylr: a queued item wakes the claim loop, a changed item its Watch
  // streams; after a reconnect both look again, as notifications may have been missed.
  private listen(): void {
    const newClient = this.options.listenClient ?? (() => new pg.Client(this.options.pool.options));
    const listener = new QueueListener(newClient, this.log);
    listener.events.on("queued", () => {
      this.claims.notifiedQueued();
      this.wakeup.notify("notify");
    });
    listener.events.on("queued:local", () => {
      this.claims.notifiedQueuedLocal();
      this.wakeup.notify("notify");
    });
    listener.events.on("changed", (id) => this.events.emit("queue:changed", id));
    listener.events.on("cancel", (id) => this.cancels.requested(id));
    listener.events.on("up", () => {
      this.claims.maybeQueued();
      this.wakeup.notify("notify");
      this.events.emit("notify:up");
    });
    listener.events.on("down", (err) => this.events.emit("notify:down", err));
    this.listener = listener;
    listener.start();
  }

  private async loop(): Promise<void> {
    const signal = this.loopAbort.signal;
    while (!signal.aborted) {
      // What woke this pass is covered by it: the claims below read the queue afresh.
      this.wakeup.clear();
      await this.claims.run(signal);
      try {
        const source = await this.wakeup.wait(this.config.pollIntervalMs, signal);
        if (source === "poll") this.claims.maybeQueued();
        if (source === "notify" || source === "submit") {
          const early = this.claims.lastClaimAt + queuedWakeGapMs - performance.now();
          if (early > 0) await sleep(early, signal);
        }
        this.events.emit("wakeup", source);
      } catch {
        return;
      }
    }
  }

  private housekeeping(beats: QueueStore): Promise<void> {
    return runHousekeeping(
      {
        queue: this.queue,
        beats,
        blobs: this.blobs,
        config: this.config,
        queueConfig: this.queueConfig,
        fylrId: this.fylrId,
        counters: this.counters,
        events: this.events,
        log: this.log,
        held: () => this.tasks.heldIds(),
        cancelCheck: () => this.cancels.check(),
        writes: this.writes,
        rejoin: async () => {
          this.tasks.abortAll(new AbortReason("disconnected", "this fylr was declared dead; its claims were requeued"));
          // A stopping fylr's row is removed right after; it does not come back.
          if (this.currentState === "running") await beats.registerFylr(this.registration());
          // Claims found nothing while this fylr had no row: look at the local queue again.
          this.claims.maybeQueued();
        },
      },
      this.housekeepingAbort.signal,
    );
  }

  private registration(): FylrRegistration {
    return { id: this.fylrId, hostname: hostname(), pid: process.pid, apiUrl: this.options.apiUrl };
  }
}
