/**
 * One claim pass of a fylr's dispatcher: exec items up to its share of the exec capacity it
 * sees, then local items up to its free permits. A kind of work known to be drained (a
 * claim came back short and no notification, poll, submit or retry came since) is not
 * asked for while LISTEN is up, so an idle queue costs no statements.
 *
 * It also decides whether a submit through this fylr may be claimed in its own insert
 * (`reserveDirect`): only while the exec queue is known drained, so the item cannot go
 * ahead of queued work this fylr knows about, and only into a free place of the exec
 * admission, reserved until the item's task holds it.
 */
import { sleep } from "../../shared/abort.js";
import type { Events } from "../../shared/typed-events.js";
import type { Logger } from "../../shared/log.js";
import { execAdmission, type ExecAdmission } from "./admission.js";
import type { CapacitySource } from "./capacity.js";
import type { DispatcherConfig } from "../config.js";
import type { DispatcherEvents } from "../events.js";
import type { ItemTasks } from "../items/item-tasks.js";
import type { LocalPermits } from "./local-permits.js";
import type { DispatcherCounters } from "../items/settle.js";
import type { QueueStore } from "../queue/queue-store.js";
import type { NormalizedSubmit } from "../queue/payload.js";
import type { ClaimedItem, ItemKind, QueueItem } from "../types.js";
import type { Wakeup } from "./wakeup.js";
import type { Boarding, ClaimRider } from "../queue/group-commit.js";

const minPriority = -2_147_483_648;

export interface ClaimPassDeps {
  readonly queue: QueueStore;
  readonly tasks: ItemTasks;
  readonly permits: LocalPermits;
  readonly capacity: CapacitySource;
  readonly config: DispatcherConfig;
  readonly counters: DispatcherCounters;
  readonly events: Events<DispatcherEvents>;
  readonly wakeup: Wakeup;
  readonly log: Logger;
  readonly fylrId: string;
  /** True while LISTEN is up: without it other fylrs' items show up only by asking. */
  readonly listening: () => boolean;
  /** True while the dispatcher runs: a stopping one claims nothing new. */
  readonly running: () => boolean;
}

export class ClaimPass implements ClaimRider {
  /** The exec admission the last pass computed. */
  admission: ExecAdmission = { admission: 0, held: 0, free: 0, shares: [] };
  /** When (performance.now()) the last claim statement of either kind was sent. */
  lastClaimAt = -Infinity;
  /** True when the database's trigger tells local items apart ("queued local", migration 0007). */
  localNotifies = false;
  private readonly execQueue = new QueueHint();
  private readonly localQueue = new QueueHint();
  private dbFailures = 0;
  // A local claim statement is on its way (alone or along with a completion): no other
  // may count the same free permits.
  private localClaiming = false;
  // Exec places promised but not yet held by a task: submits being inserted already
  // claimed, and the items an exec claim statement in flight may bring back. Admission
  // counts them as held, so neither can take a place the other took.
  private reserved = 0;
  // Items claimed as the fylr stopped, on their way back to the queue.
  private readonly givingBack = new Set<Promise<unknown>>();
  private idleWaiters: (() => void)[] = [];

  constructor(private readonly deps: ClaimPassDeps) {}

  /** Anything may have been queued: the next pass asks for both kinds. */
  maybeQueued(): void {
    this.execQueue.maybeQueued();
    this.localQueue.maybeQueued();
  }

  /** This fylr queued an item of that kind itself. */
  queuedHere(kind: ItemKind): void {
    (kind === "local" ? this.localQueue : this.execQueue).maybeQueued();
  }

  /** A "queued" notification; a database without migration 0007 never says which kind. */
  notifiedQueued(): void {
    this.execQueue.maybeQueued();
    if (!this.localNotifies) this.localQueue.maybeQueued();
  }

  /** A "queued local" notification. */
  notifiedQueuedLocal(): void {
    this.localQueue.maybeQueued();
  }

  /**
   * A place of the exec admission for a submit this fylr may claim in its insert, or
   * undefined when it must be queued as usual: LISTEN is down (other fylrs' queued items
   * would go unseen), the exec queue is not known drained, the item is local or not
   * eligible yet, or admission is full. Call the returned function once the item's task
   * holds the place (`claimedDirectly`) or the insert came back queued or failed.
   */
  reserveDirect(n: NormalizedSubmit): (() => void) | undefined {
    if (n.kind !== "exec" || (n.startAfter && n.startAfter.getTime() > Date.now())) return undefined;
    // A key's limit is counted by the claim (sql.claimExecItems), which a direct claim skips.
    if (n.fairnessLimit !== undefined) return undefined;
    if (!this.deps.listening() || !this.execQueue.knownEmpty) return undefined;
    if (this.execAdmissionNow().free === 0) return undefined;
    return this.reserve(1);
  }

  /**
   * Starts the task of an item claimed in its insert once the promise chain resolving the
   * submit has run (a tick scheduled now runs after it), so a Submit over HTTP has written
   * its answer before the task's WANT, pipes and events cost anything. `place` (the
   * reservation) is held until then; whether the dispatcher still runs is asked then.
   */
  startDirectly(item: QueueItem, running: () => boolean, place: (() => void) | undefined): void {
    process.nextTick(() => {
      try {
        this.claimedDirectly(item, running());
      } catch (err) {
        this.deps.log.error({ err, itemId: item.id }, "could not start the task of an item claimed in its insert");
      } finally {
        place?.();
      }
    });
  }

  /**
   * An item this fylr's submit inserted already claimed: its task starts as a claimed
   * item's would. A stop that began while the insert was on its way starts nothing new
   * (`running` false): the item goes back to the queue.
   */
  claimedDirectly(item: QueueItem, running: boolean): void {
    const { counters, tasks } = this.deps;
    if (running) {
      counters.claimedDirectly += 1;
      return tasks.spawn(item as ClaimedItem, undefined);
    }
    this.giveBack(item as ClaimedItem, "could not give back an item claimed as this fylr stopped; a sibling's sweep requeues it");
  }

  /**
   * Resolves once no place is reserved and no give-back is on its way (false after
   * `timeoutMs`): a stop waits for it, so no claim that landed late outlives the stop.
   */
  async settled(timeoutMs: number): Promise<boolean> {
    const idle = new Promise<boolean>((resolve) => {
      const check = (): void => void (this.reserved === 0 && this.givingBack.size === 0 ? resolve(true) : this.idleWaiters.push(check));
      check();
    });
    const timeout = new AbortController();
    const done = await Promise.race([idle, sleep(timeoutMs, timeout.signal).then(() => false, () => false)]);
    timeout.abort();
    return done;
  }

  private giveBack(item: ClaimedItem, failure: string): void {
    const { queue, log } = this.deps;
    const back = queue.release(item, 0).catch((err: unknown) => log.warn({ err, itemId: item.id }, failure));
    this.givingBack.add(back);
    void back.finally(() => {
      this.givingBack.delete(back);
      this.wakeIdleWaiters();
    });
  }

  private wakeIdleWaiters(): void {
    const waiters = this.idleWaiters;
    this.idleWaiters = [];
    for (const check of waiters) check();
  }

  /** Claims what admission allows; a database failure is logged and retried next pass. */
  async run(signal: AbortSignal): Promise<void> {
    const { counters, events, log } = this.deps;
    const claimedBefore = counters.claimed;
    try {
      // A fylr declared dead meanwhile claims nothing (the claim requires its row); its
      // next heartbeat finds out and re-registers.
      await this.claimExec();
      if (!signal.aborted) await this.claimLocal();
      if (this.dbFailures > 0) log.info({ failures: this.dbFailures }, "database reachable again");
      this.dbFailures = 0;
    } catch (err) {
      if (signal.aborted) return;
      this.dbFailures += 1;
      // Staged: the first failure and every 30th are warnings, the rest debug noise.
      const level = this.dbFailures === 1 || this.dbFailures % 30 === 0 ? "warn" : "debug";
      log[level]({ err, failures: this.dbFailures }, "dispatcher pass failed; retrying next poll");
    } finally {
      counters.passes += 1;
      events.emit("pass", counters.claimed - claimedBefore);
    }
  }

  private async claimExec(): Promise<void> {
    const { tasks, config, queue, fylrId, wakeup } = this.deps;
    this.admission = this.execAdmissionNow();
    const want = Math.min(this.admission.free, config.maxClaimBatch);
    if (want === 0) return;
    if (this.execQueue.knownEmpty && this.deps.listening()) return;
    const token = this.execQueue.begin();
    this.lastClaimAt = performance.now();
    const unreserve = this.reserve(want);
    let items;
    try {
      items = await queue.claim(fylrId, "exec", minPriority, want);
    } finally {
      unreserve();
    }
    if (items.length < want) this.execQueue.sawEmpty(token);
    for (const item of items) tasks.spawn(item, undefined);
    if (items.length === want && this.admission.free > want) wakeup.notify("backlog");
  }

  /**
   * The claim to send in the statement that completes items freeing `freed` exec places
   * (or, with none, `freedPermits` local permits): what a claim pass right after it would
   * ask for (admission or permits counting those as free), under the same rules (not while
   * that queue is known drained with LISTEN up, nor once stopping). The exec places are
   * reserved until the write lands or fails; no local claim statement goes meanwhile.
   */
  board(freed: number, freedPermits = 0): Boarding | undefined {
    const { tasks, config, capacity, fylrId, wakeup } = this.deps;
    if (!this.deps.running()) return undefined;
    if (freed === 0) return freedPermits > 0 ? this.boardLocal(freedPermits) : undefined;
    if (this.execQueue.knownEmpty && this.deps.listening()) return undefined;
    const admission = execAdmission(capacity.instances(), Math.max(0, tasks.execHeld + this.reserved - freed), config.headroom);
    const limit = Math.min(admission.free, config.maxClaimBatch);
    if (limit === 0) return undefined;
    const token = this.execQueue.begin();
    this.lastClaimAt = performance.now();
    const unreserve = this.reserve(limit);
    return {
      fylrId,
      limit,
      landed: (items) => {
        unreserve();
        if (items.length < limit) this.execQueue.sawEmpty(token);
        // A stop that began while the write was on its way starts nothing new: back to the queue.
        if (!this.deps.running()) return void items.forEach((item) => this.claimedDirectly(item, false));
        for (const item of items) tasks.spawn(item, undefined);
        if (items.length === limit && admission.free > limit) wakeup.notify("backlog");
      },
      missed: unreserve,
    };
  }

  private boardLocal(freedPermits: number): Boarding | undefined {
    const { permits, config, fylrId } = this.deps;
    if (this.localClaiming || (this.localQueue.knownEmpty && this.deps.listening())) return undefined;
    const highPriority = permits.highPriority;
    const total = Math.min(permits.available(highPriority, freedPermits), config.maxClaimBatch);
    if (total === 0) return undefined;
    const normal = Math.min(permits.available(minPriority, freedPermits), total);
    const token = this.localQueue.begin();
    this.lastClaimAt = performance.now();
    this.localClaiming = true;
    return {
      fylrId,
      limit: total,
      local: { normal, highPriority },
      landed: (items) => {
        this.localClaiming = false;
        // A stop that began while the write was on its way starts nothing new: back to the queue.
        if (!this.deps.running()) return void items.forEach((item) => this.claimedDirectly(item, false));
        this.startLocal(items, token, total, normal);
      },
      missed: () => void (this.localClaiming = false),
    };
  }

  // Places reserved count as held.
  private execAdmissionNow(): ExecAdmission {
    const { capacity, tasks, config } = this.deps;
    return execAdmission(capacity.instances(), tasks.execHeld + this.reserved, config.headroom);
  }

  private reserve(places: number): () => void {
    this.reserved += places;
    let released = false;
    return () => {
      if (released) return;
      released = true;
      this.reserved -= places;
      if (this.idleWaiters.length > 0) this.wakeIdleWaiters();
    };
  }

  private async claimLocal(): Promise<void> {
    const { permits, config, queue, fylrId } = this.deps;
    // A local claim riding along with a completion takes the free permits already.
    if (this.localClaiming) return;
    const highPriority = permits.highPriority;
    const total = Math.min(permits.available(highPriority), config.maxClaimBatch);
    if (total === 0) return;
    if (this.localQueue.knownEmpty && this.deps.listening()) return;
    const normal = Math.min(permits.available(minPriority), total);
    // Only the high-priority reserve is free, and no high-priority item is known queued.
    if (normal === 0 && this.localQueue.knownHighEmpty && this.deps.listening()) return;
    const token = this.localQueue.begin();
    this.lastClaimAt = performance.now();
    this.localClaiming = true;
    let items;
    try {
      items = await queue.claimLocal(fylrId, { total, normal, highPriority });
    } finally {
      this.localClaiming = false;
    }
    this.startLocal(items, token, total, normal);
  }

  /** Starts the local items a claim of `total` (`normal` of them normal) begun with `token` brought, each with its permit. */
  private startLocal(items: readonly ClaimedItem[], token: number, total: number, normal: number): void {
    const { permits, tasks, log } = this.deps;
    // Empty for sure only when no priority reserve could have held normal items back.
    if ((items.length === 0 && normal > 0) || (normal === total && items.length < total)) this.localQueue.sawEmpty(token);
    // High-priority items come first in claim order: fewer than `total` of them means none was left.
    if (items.filter((i) => i.priority >= permits.highPriority).length < total) this.localQueue.sawHighEmpty(token);
    // Claim order puts high-priority items first, as the query counted them.
    for (const item of items) {
      const permit = permits.tryReserve(item.priority);
      if (permit) {
        tasks.spawn(item, permit);
        continue;
      }
      // Cannot happen while the query and LocalPermits agree; never run without a permit.
      log.error({ itemId: item.id, priority: item.priority }, "claimed a local item without a free permit; giving it back");
      this.giveBack(item, "could not give the item back");
    }
  }
}

/**
 * Whether one kind's part of the queue (exec or local) may hold an item this fylr could
 * claim. A claim pass runs for many reasons (an item finished, execserver capacity
 * changed, a notification), and many of them cannot have queued an item of each kind;
 * asking Postgres anyway cost a statement (and its trigger) per kind and pass. Once a claim
 * found the queue of its kind drained, later passes skip it until something may have
 * queued one: a queue notification, a poll, this fylr's own submit or retry. A
 * notification that arrives while the claim is in flight keeps the hint open (the claim's
 * snapshot may predate the item).
 */
export class QueueHint {
  private generation = 0;
  private empty = false;
  private highEmpty = false;

  /** Something may have queued an item of this kind: the next pass claims again. */
  maybeQueued(): void {
    this.generation += 1;
    this.empty = false;
    this.highEmpty = false;
  }

  /** True when the last claim drained the queue and nothing may have been queued since. */
  get knownEmpty(): boolean {
    return this.empty;
  }

  /** Like knownEmpty, for the high-priority items alone (those the local reserve may take). */
  get knownHighEmpty(): boolean {
    return this.empty || this.highEmpty;
  }

  /** The claim begun with `token` left no claimable high-priority item of this kind. */
  sawHighEmpty(token: number): void {
    if (token === this.generation) this.highEmpty = true;
  }

  /** Call before a claim; hand the token to `sawEmpty`. */
  begin(): number {
    return this.generation;
  }

  /** The claim begun with `token` left no claimable item of this kind. */
  sawEmpty(token: number): void {
    if (token === this.generation) this.empty = true;
  }
}
