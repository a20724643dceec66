/**
 * The dispatcher loop: one per fylr. It wakes on a NOTIFY from any fylr (an item was
 * queued), right after one of its items finished, when the capacity changed, and at the
 * latest every poll interval; each pass claims what admission allows — exec items up to
 * its share of the exec capacity it sees, local items up to free permits — handing each
 * item to its own task, then heartbeats and requeues dead siblings' claims when due.
 */
import { randomUUID } from "node:crypto";
import { hostname } from "node:os";
import pg from "pg";
import { AbortReason } from "../shared/abort.js";
import { Code, SlotbrokerError } from "../shared/errors.js";
import { Events } from "../shared/events.js";
import { IllegalTransitionError, Transitions } from "../shared/lifecycle.js";
import { silentLogger, type Logger } from "../shared/log.js";
import { execAdmission, type ExecAdmission, type InstanceShare } from "./admission.js";
import { BlobStore } from "./blob-store.js";
import type { CapacitySource } from "./capacity.js";
import { CompletionBatcher, RunningBatcher } from "./completion-batcher.js";
import { dispatcherConfig, effectiveLocalSlots, type DispatcherConfig } from "./config.js";
import type { DispatcherEvents, DispatcherState } from "./events.js";
import type { ExecBackend } from "./exec-backend.js";
import { ItemFollowers } from "./followers.js";
import { ItemTasks } from "./item-tasks.js";
import { LiveItems, type LiveItem } from "./live.js";
import { createDefaultActions, type LocalActionRegistry } from "./local-actions.js";
import { LocalPermits } from "./local-permits.js";
import { migrate } from "./migrate.js";
import { normalizeSubmit } from "./payload.js";
import { QueueListener } from "./queue-listener.js";
import { newCounters, type DispatcherCounters } from "./settle.js";
import { QueueStore, type StoredPosition } from "./store.js";
import { storeConfig, type StoreConfig } from "./store-config.js";
import type { QueueItem, SubmitInput } from "./types.js";
import { Wakeup } from "./wakeup.js";

export type { DispatcherState };

const transitions = new Transitions<DispatcherState>("dispatcher", {
  idle: ["running", "stopped"],
  running: ["stopping"],
  stopping: ["stopped"],
  stopped: [],
});

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

const minPriority = -2_147_483_648;
const forceTimeoutMs = 5000;

/** The Postgres dispatcher of one fylr. */
export class Dispatcher {
  readonly store: QueueStore;
  /** Stored inputs and outputs: every fylr of the queue reads what any wrote. */
  readonly blobs: BlobStore;
  readonly config: DispatcherConfig;
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
  private readonly loopAbort = new AbortController();
  // Aborted once stopped: outcome writes still retrying give up.
  private readonly writesAbort = new AbortController();
  // Aborted by a stop({ graceMs: 0 }) that arrives while a graceful stop is waiting.
  private readonly graceCut = new AbortController();
  private currentState: DispatcherState = "idle";
  private admission: ExecAdmission = { admission: 0, held: 0, free: 0, shares: [] };
  private lastBeatAt = -Infinity;
  private lastBlobSweepAt = -Infinity;
  private dbFailures = 0;
  private loopDone: Promise<void> = Promise.resolve();
  private stopping: Promise<void> | undefined;
  private unsubscribeCapacity: () => void = () => undefined;
  private listener: QueueListener | undefined;
  private readonly followers: ItemFollowers;

  constructor(private readonly options: DispatcherOptions) {
    this.config = dispatcherConfig(options.config);
    this.store = new QueueStore(options.pool);
    this.fylrId = options.fylrId ?? randomUUID();
    this.blobs = new BlobStore(options.blobPool ?? options.pool, storeConfig(options.store), this.fylrId);
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
    this.tasks = new ItemTasks({
      store: this.store,
      completer: new CompletionBatcher(this.store),
      starter: new RunningBatcher(this.store),
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
    await this.store.registerFylr({ id: this.fylrId, hostname: hostname(), pid: process.pid, apiUrl: this.options.apiUrl });
    this.setState("running");
    this.unsubscribeCapacity = this.options.capacity.subscribe(() => this.wakeup.notify("capacity"));
    if (this.config.listen) this.listen();
    this.loopDone = this.loop();
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
    try {
      await this.store.deregisterFylr(this.fylrId);
    } catch (err) {
      // Our row goes stale instead and siblings sweep our claims after the threshold.
      this.log.warn({ err }, "could not remove this fylr's row");
    }
    this.setState("stopped");
    this.writesAbort.abort(new AbortReason("shutdown", "dispatcher stopped"));
    this.log.info(this.counters, "dispatcher stopped");
    if (left > 0) throw new DispatcherStopTimeoutError(left, forceTimeoutMs);
  }

  /** Validates and enqueues an item (or returns the one holding its idempotency key). */
  async submit(input: SubmitInput): Promise<{ item: QueueItem; created: boolean }> {
    const normalized = normalizeSubmit(input, this.actions, {
      maxInputBytes: this.config.maxInputBytes,
      defaultMaxAttempts: this.config.maxAttempts,
    });
    const result = await this.store.submit(normalized);
    if (result.created) this.wakeup.notify("submit");
    return result;
  }

  /** An item from the database, or undefined. */
  get(id: string): Promise<QueueItem | undefined> {
    return this.store.get(id);
  }

  /** Where an item stands: the database count ahead of it, plus this fylr's live view. */
  async position(id: string): Promise<ItemPosition | undefined> {
    const stored = await this.store.position(id);
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
    this.wakeup.notify("notify");
  }

  /** A snapshot of admission, holdings and counters. */
  stats(): DispatcherStats {
    const permits = this.permits.counts();
    return {
      fylrId: this.fylrId,
      state: this.currentState,
      execHeld: this.tasks.execHeld,
      execAdmission: this.admission.admission,
      shares: this.admission.shares,
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
    listener.events.on("queued", () => this.wakeup.notify("notify"));
    listener.events.on("changed", (id) => this.events.emit("queue:changed", id));
    listener.events.on("up", () => {
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
      await this.pass(signal);
      try {
        this.events.emit("wakeup", await this.wakeup.wait(this.config.pollIntervalMs, signal));
      } catch {
        return;
      }
    }
  }

  private async pass(signal: AbortSignal): Promise<void> {
    const claimedBefore = this.counters.claimed;
    try {
      // Claims first: a pass woken by a notification claims within one round trip. A fylr
      // declared dead meanwhile claims nothing (the claim requires its row); the heartbeat
      // right after finds out and re-registers.
      await this.claimExec();
      if (!signal.aborted) await this.claimLocal();
      if (!signal.aborted && performance.now() - this.lastBeatAt >= this.config.heartbeatIntervalMs) {
        await this.heartbeat();
        await this.sweep();
      }
      if (!signal.aborted && performance.now() - this.lastBlobSweepAt >= this.blobs.config.sweepIntervalMs) await this.sweepBlobs();
      if (this.dbFailures > 0) this.log.info({ failures: this.dbFailures }, "database reachable again");
      this.dbFailures = 0;
    } catch (err) {
      if (signal.aborted) return;
      this.dbFailures += 1;
      // Staged: the first failure and every 30th are warnings, the rest debug noise.
      const level = this.dbFailures === 1 || this.dbFailures % 30 === 0 ? "warn" : "debug";
      this.log[level]({ err, failures: this.dbFailures }, "dispatcher pass failed; retrying next poll");
    } finally {
      this.counters.passes += 1;
      this.events.emit("pass", this.counters.claimed - claimedBefore);
    }
  }

  private async heartbeat(): Promise<void> {
    const alive = await this.store.heartbeat(this.fylrId);
    this.lastBeatAt = performance.now();
    if (alive) return;
    // A sibling found our heartbeat stale (a long pause, a lost database connection) and
    // requeued our claims. Whatever we still run belongs to someone else now: abort it all
    // and come back as a fresh member.
    const held = this.tasks.size;
    this.log.error({ incident: "declared-dead", held }, "this fylr was declared dead by a sibling; abandoning held items and re-registering");
    this.tasks.abortAll(new AbortReason("disconnected", "this fylr was declared dead; its claims were requeued"));
    await this.store.registerFylr({ id: this.fylrId, hostname: hostname(), pid: process.pid, apiUrl: this.options.apiUrl });
  }

  private async sweep(): Promise<void> {
    const reaped = await this.store.reapStale(this.config.staleAfterMs, this.fylrId);
    const rescued = reaped.requeued.length + reaped.failed.length;
    this.counters.orphansRescued += rescued;
    if (reaped.deadFylrs.length > 0 || rescued > 0) {
      this.events.emit("orphans:rescued", reaped);
      this.log.warn(
        { deadFylrs: reaped.deadFylrs, requeued: reaped.requeued.length, failed: reaped.failed.map((f) => f.id) },
        "requeued the claims of fylrs whose heartbeat went stale",
      );
    }
  }

  // Stored data past its expiry or retention. Any fylr may do it; a row deleted by two
  // sweepers at once is deleted once. Batches of 100, so one pass stays short.
  private async sweepBlobs(): Promise<void> {
    this.lastBlobSweepAt = performance.now();
    let total = { blobs: 0, bytes: 0 };
    for (let round = 0; round < 10; round++) {
      const swept = await this.blobs.sweep(100);
      total = { blobs: total.blobs + swept.blobs, bytes: total.bytes + swept.bytes };
      if (swept.blobs < 100) break;
    }
    if (total.blobs > 0) this.log.info(total, "deleted stored data past its expiry or retention");
  }

  private async claimExec(): Promise<void> {
    this.admission = execAdmission(this.options.capacity.instances(), this.tasks.execHeld, this.config.headroom);
    const want = Math.min(this.admission.free, this.config.maxClaimBatch);
    if (want === 0) return;
    const items = await this.store.claim(this.fylrId, "exec", minPriority, want);
    for (const item of items) this.tasks.spawn(item, undefined);
    if (items.length === want && this.admission.free > want) this.wakeup.notify("backlog");
  }

  private async claimLocal(): Promise<void> {
    const highPriority = this.permits.highPriority;
    const total = Math.min(this.permits.available(highPriority), this.config.maxClaimBatch);
    if (total === 0) return;
    const normal = Math.min(this.permits.available(minPriority), total);
    const items = await this.store.claimLocal(this.fylrId, { total, normal, highPriority });
    // Claim order puts high-priority items first, as the query counted them.
    for (const item of items) {
      const permit = this.permits.tryReserve(item.priority);
      if (permit) {
        this.tasks.spawn(item, permit);
        continue;
      }
      // Cannot happen while the query and LocalPermits agree; never run without a permit.
      this.log.error({ itemId: item.id, priority: item.priority }, "claimed a local item without a free permit; giving it back");
      void this.store.release(item, 0).catch((err: unknown) => this.log.error({ err, itemId: item.id }, "could not give the item back"));
    }
  }
}
