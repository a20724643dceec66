/**
 * The dispatcher's second loop: this fylr's heartbeat and the sweep of dead siblings'
 * claims every heartbeat interval; the sweep of expired stored data, the VACUUM that gives
 * the space of rolled-back writes back and the sweep of finished items past the queue's
 * retention when each is due; now and then the audit of its own claims that no task holds
 * (lost claims, below). It runs apart from the claim loop, so a slow claim pass (a busy
 * database, a large batch) never delays the heartbeat towards the stale threshold, and it
 * runs on while a stopping dispatcher lets its items finish: a graceful stop longer than
 * the threshold must not look like a death to the siblings.
 */
import { sleep } from "../../shared/abort.js";
import type { Events } from "../../shared/typed-events.js";
import type { Logger } from "../../shared/log.js";
import type { BlobStore } from "../blobs/blob-store.js";
import type { DispatcherConfig } from "../config.js";
import type { DispatcherEvents } from "../events.js";
import type { DispatcherCounters } from "../items/settle.js";
import { finishedSweepBatch, type QueueConfig } from "../queue/queue-config.js";
import { namedQuery } from "../queue/named-query.js";
import type { QueueStore } from "../queue/queue-store.js";
import type { WriteHealth } from "./write-health.js";
import { fromPgError } from "../queue/pg-errors.js";
import type { Fence } from "../types.js";

/** What the housekeeping loop works with. */
export interface HousekeepingDeps {
  /** The queue, for the sweep. */
  readonly queue: QueueStore;
  /** The same tables over the heartbeat's own connection. */
  readonly beats: QueueStore;
  readonly blobs: BlobStore;
  readonly config: DispatcherConfig;
  /** The retention of finished rows. */
  readonly queueConfig: QueueConfig;
  readonly fylrId: string;
  readonly counters: DispatcherCounters;
  readonly events: Events<DispatcherEvents>;
  readonly log: Logger;
  /** The ids of the items this fylr holds (for the lost-claims audit and the log). */
  readonly held: () => readonly string[];
  /** A sibling declared this fylr dead: drop every held item and register again. */
  readonly rejoin: () => Promise<void>;
  /** Held items cancelled meanwhile (a missed notification) and cancels past the bound (see CancelWatch in item-tasks.ts). */
  readonly cancelCheck?: () => Promise<void>;
  /** Told each heartbeat's outcome (readiness: can the database be written?). */
  readonly writes?: WriteHealth;
}

/** Runs until `signal` aborts; resolves once the last beat and any sweep still running ended. */
export async function runHousekeeping(deps: HousekeepingDeps, signal: AbortSignal): Promise<void> {
  const { config, log } = deps;
  let failures = 0;
  // The sweeps run beside the beat, one of each kind at a time: a slow sweep (locked rows,
  // a big queue) never delays the next beat.
  const claimSweep = new Background(log, "sweep of stale claims");
  const blobSweep = new Background(log, "sweep of stored data");
  const cancelCheck = new Background(log, "cancel check");
  const lostClaims = new Background(log, "audit of held claims");
  const vacuum = new Background(log, "vacuum of the store");
  const itemSweep = new Background(log, "sweep of finished items");
  let lastBlobSweepAt = -Infinity;
  let lastItemSweepAt = -Infinity;
  let lastAuditAt = performance.now();
  const gate = new SweepGate(config.staleAfterMs, performance.now());
  while (!signal.aborted) {
    const startedAt = performance.now();
    try {
      await heartbeat(deps);
      deps.writes?.wrote(performance.now());
      if (failures > 0) log.info({ failures }, "database reachable again (heartbeat)");
      failures = 0;
      gate.healthy(performance.now());
    } catch (err) {
      if (signal.aborted) break;
      deps.writes?.failed(err);
      gate.unhealthy();
      failures += 1;
      // Staged: the first failure and every 30th are warnings, the rest debug noise.
      log[failures === 1 || failures % 30 === 0 ? "warn" : "debug"]({ err, failures }, "heartbeat failed; retrying next interval");
    }
    // After an outage (or right after start) every sibling's heartbeat may look stale.
    if (gate.mayReap(performance.now())) claimSweep.runUnlessBusy(() => sweepStaleClaims(deps));
    if (deps.cancelCheck) cancelCheck.runUnlessBusy(deps.cancelCheck);
    if (performance.now() - lastAuditAt >= config.staleAfterMs && lostClaims.runUnlessBusy(() => auditClaims(deps))) lastAuditAt = performance.now();
    if (performance.now() - lastBlobSweepAt >= deps.blobs.config.sweepIntervalMs && blobSweep.runUnlessBusy(() => sweepBlobs(deps))) {
      lastBlobSweepAt = performance.now();
    }
    if (deps.blobs.room.vacuumDue()) vacuum.runUnlessBusy(() => vacuumStore(deps));
    const retentionMs = deps.queueConfig.retentionMs;
    if (retentionMs !== undefined && performance.now() - lastItemSweepAt >= deps.queueConfig.sweepIntervalMs) {
      if (itemSweep.runUnlessBusy(() => sweepFinishedItems(deps, retentionMs, signal))) lastItemSweepAt = performance.now();
    }
    const wait = config.heartbeatIntervalMs - (performance.now() - startedAt);
    await sleep(Math.max(0, wait), signal).catch(() => undefined);
  }
  await claimSweep.idle();
  await blobSweep.idle();
  await cancelCheck.idle();
  await lostClaims.idle();
  await vacuum.idle();
  await itemSweep.idle();
}

// One background task of a kind at a time; its failures are logged, staged.
class Background {
  private running: Promise<void> | undefined;
  private failures = 0;

  constructor(
    private readonly log: Logger,
    private readonly what: string,
  ) {}

  /** Starts `task` unless the previous one still runs; true when it started. */
  runUnlessBusy(task: () => Promise<void>): boolean {
    if (this.running) return false;
    this.running = task()
      .then(() => {
        this.failures = 0;
      })
      .catch((err: unknown) => {
        this.failures += 1;
        this.log[this.failures === 1 || this.failures % 30 === 0 ? "warn" : "debug"]({ err, failures: this.failures }, `${this.what} failed; retrying later`);
      })
      .finally(() => (this.running = undefined));
    return true;
  }

  /** Resolves once no task runs. */
  async idle(): Promise<void> {
    await this.running;
  }
}

async function heartbeat(deps: HousekeepingDeps): Promise<void> {
  const alive = await deps.beats.heartbeat(deps.fylrId);
  deps.events.emit("heartbeat", alive);
  if (alive) return;
  // A sibling found our heartbeat stale (a long pause, a lost database connection) and
  // requeued our claims. Whatever we still run belongs to someone else now.
  deps.log.error({ incident: "declared-dead", held: deps.held().length }, "this fylr was declared dead by a sibling; abandoning held items and re-registering");
  await deps.rejoin();
}

async function sweepStaleClaims(deps: HousekeepingDeps): Promise<void> {
  const reaped = await deps.queue.reapStale(deps.config.staleAfterMs, deps.fylrId);
  const rescued = reaped.requeued.length + reaped.failed.length + reaped.cancelled.length;
  deps.counters.orphansRescued += rescued;
  if (reaped.deadFylrs.length > 0 || rescued > 0) {
    deps.events.emit("orphans:rescued", reaped);
    deps.log.warn(
      { deadFylrs: reaped.deadFylrs, requeued: reaped.requeued.length, failed: reaped.failed.map((f) => f.id) },
      "requeued the claims of fylrs whose heartbeat went stale",
    );
  }
  // Their writes died with them: what they reserved is free again.
  if (reaped.deadFylrs.length > 0) await reclaimRoom(deps);
}

async function reclaimRoom(deps: HousekeepingDeps): Promise<void> {
  const reclaimed = await deps.blobs.room.reclaim();
  if (reclaimed.reservations > 0) deps.log.warn(reclaimed, "ended the store reservations of fylrs that are gone (their writes were rolled back)");
}

async function vacuumStore(deps: HousekeepingDeps): Promise<void> {
  const report = await deps.blobs.room.vacuum();
  deps.log.info({ ...report, freedBytes: report.beforeBytes - report.afterBytes }, "vacuumed the store after rolled-back or deleted writes");
}

// Stored data past its expiry or retention. Any fylr may do it; a row deleted by two
// sweepers at once is deleted once. Batches of 100, at most 10 per round.
async function sweepBlobs(deps: HousekeepingDeps): Promise<void> {
  let total = { blobs: 0, bytes: 0 };
  for (let round = 0; round < 10; round++) {
    const swept = await deps.blobs.sweep(100);
    total = { blobs: total.blobs + swept.blobs, bytes: total.bytes + swept.bytes };
    if (swept.blobs < 100) break;
  }
  if (total.blobs > 0) deps.log.info(total, "deleted stored data past its expiry or retention");
  await reclaimRoom(deps);
}

// Finished rows past queue.retention, oldest first, a bounded batch per statement until a
// batch comes back short or the fylr stops: never on the claim path, never one long
// transaction. Any fylr may do it; rows another sweeper holds are skipped, so each row is
// deleted (and counted) once.
async function sweepFinishedItems(deps: HousekeepingDeps, retentionMs: number, signal: AbortSignal): Promise<void> {
  const total = { items: 0, blobs: 0, bytes: 0 };
  while (!signal.aborted) {
    const swept = await deps.queue.sweepFinished(retentionMs, finishedSweepBatch);
    total.items += swept.items;
    total.blobs += swept.blobs;
    total.bytes += swept.bytes;
    deps.counters.finishedDeleted += swept.items;
    // Their stored data went with them: dead chunk rows for the store's VACUUM.
    deps.blobs.room.noteDead(swept.bytes);
    if (swept.items < finishedSweepBatch) break;
  }
  if (total.items > 0) deps.log.info({ ...total, retentionMs }, "deleted finished items past the queue's retention (queue.retention)");
}

async function auditClaims(deps: HousekeepingDeps): Promise<void> {
  const released = await releaseLostClaims(deps.queue, deps.fylrId, lostClaimAgeMs(deps.config.staleAfterMs), deps.held);
  for (const fence of released) {
    deps.log.warn({ incident: "lost-claim", itemId: fence.id, lease: fence.lease }, "an item claimed by this fylr had no task here (the claim's answer was lost); gave it back to the queue");
  }
}

// --- when the sweep may run ----------------------------------------------------------

/**
 * When a fylr may sweep its siblings' stale claims. A heartbeat older than the threshold
 * means "dead" only if the sweeper itself could have seen the sibling's heartbeats all that
 * time. After a database outage every heartbeat is stale at once, and a sibling that has
 * not reconnected yet is as alive as this fylr; right after start, likewise. So: no sweep
 * until this fylr has been healthy (database reachable) for `staleAfterMs`, counted from
 * its start and again from the end of every outage.
 */
export class SweepGate {
  private healthySince: number | undefined;

  constructor(
    private readonly staleAfterMs: number,
    now: number,
  ) {
    this.healthySince = now;
  }

  /** A database round trip failed: the healthy period starts over at the next success. */
  unhealthy(): void {
    this.healthySince = undefined;
  }

  /** A pass reached the database. */
  healthy(now: number): void {
    this.healthySince ??= now;
  }

  /** True once healthy for the whole stale threshold. */
  mayReap(now: number): boolean {
    return this.healthySince !== undefined && now - this.healthySince >= this.staleAfterMs;
  }
}

// --- lost claims ---------------------------------------------------------------------
//
// Claims this fylr holds in the database but not in memory. A claim statement (a pass's,
// one carried by a success, a submit claimed in its insert) can commit while its answer
// never arrives (the connection dies between the commit and the reply): the rows say this
// fylr holds the items, no task runs them, and while this fylr lives no sibling's sweep
// touches them. The audit finds such rows, old enough that no answer can still be on its
// way, and gives them back to the queue, fenced by their lease (a row settled or claimed
// again meanwhile is left alone).

/** $1 this fylr, $2 the age in ms a claim must have before it counts as lost. */
export const claimsOlderThan = `
SELECT id, claimed_by, lease FROM queue_items
WHERE claimed_by = $1 AND state IN ('claimed', 'running')
  AND claimed_at < now() - $2::double precision * interval '1 millisecond'`;

/** How old a claim must be before the audit may call it lost: well past any answer. */
export function lostClaimAgeMs(staleAfterMs: number): number {
  return 4 * staleAfterMs;
}

/**
 * Gives back this fylr's claims older than `ageMs` that `held()` does not list; resolves
 * with the fences given back. `held` is asked after the rows are read, so a task that
 * started meanwhile still counts as held.
 */
export async function releaseLostClaims(queue: QueueStore, fylrId: string, ageMs: number, held: () => readonly string[]): Promise<Fence[]> {
  let rows: Fence[];
  try {
    type Row = { id: string; claimed_by: string; lease: string };
    const result = await namedQuery<Row>(queue.pool, claimsOlderThan, [fylrId, ageMs]);
    rows = result.rows.map((r) => ({ id: r.id, claimedBy: r.claimed_by, lease: Number(r.lease) }));
  } catch (err) {
    throw fromPgError(err, "audit of held claims");
  }
  if (rows.length === 0) return [];
  const known = new Set(held());
  const lost = rows.filter((r) => !known.has(r.id));
  const released: Fence[] = [];
  for (const fence of lost) if (await queue.release(fence, 0)) released.push(fence);
  return released;
}
