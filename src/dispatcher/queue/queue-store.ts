/**
 * The queue store: typed calls over the named queries in sql.ts for queue_items and fylrs;
 * every error leaves it translated (pg-errors.ts). Text from peers is made storable first
 * (storableText, below).
 */
import type pg from "pg";
import { Code, SlotbrokerError } from "../../shared/errors.js";
import { encodeResults, insertedItem, itemFromRow, type InsertedRow, type ItemRow, type NormalizedSubmit } from "./payload.js";
import { fromPgError } from "./pg-errors.js";
import { namedQuery } from "./named-query.js";
import * as blobSql from "../blobs/blob-sql.js";
import * as sql from "./sql.js";
import type { ItemOutput } from "../blobs/output-sink.js";
import type { CallResult, ClaimedItem, Fence, ItemKind, ItemState, QueueItem } from "../types.js";

/** What a fylr says about itself in the `fylrs` table. */
export interface FylrRegistration {
  readonly id: string;
  readonly hostname: string;
  readonly pid: number;
  readonly apiUrl?: string;
  readonly version?: string;
}

/** A live fylr as listed for status pages. */
export interface FylrRow {
  readonly id: string;
  readonly hostname: string;
  readonly pid: number;
  readonly apiUrl: string | undefined;
  readonly startedAt: Date;
  readonly heartbeatAt: Date;
  readonly held: number;
}

/** What one stale-claim sweep did. */
export interface ReapResult {
  /** Fylr rows removed for a stale heartbeat. */
  readonly deadFylrs: readonly string[];
  /** Items sent back to the queue. */
  readonly requeued: readonly { id: string; claimedBy: string }[];
  /** Items failed because their owner died during their last attempt. */
  readonly failed: readonly { id: string; claimedBy: string }[];
  /** Items whose cancel was pending: cancelled, never requeued. */
  readonly cancelled: readonly { id: string; claimedBy: string }[];
}

/** Open items of one kind, state and priority (status pages). */
export interface OpenItemCount {
  readonly kind: ItemKind;
  readonly state: ItemState;
  readonly priority: number;
  readonly count: number;
}

/** One fairness key's open items across all fylrs. */
export interface KeyCount {
  /** "" is the default key. */
  readonly fairnessKey: string;
  readonly queued: number;
  /** Claimed or running. */
  readonly held: number;
  /** When its oldest queued item was submitted; undefined when none is queued. */
  readonly oldestQueued: Date | undefined;
}

/** An item as the status page lists it. */
export interface ItemSummary {
  readonly id: string;
  readonly kind: ItemKind;
  readonly priority: number;
  /** "" is the default key. */
  readonly fairnessKey: string;
  readonly state: ItemState;
  readonly attempts: number;
  readonly claimedBy: string | undefined;
  readonly updatedAt: Date;
  /** The first 240 characters of the error. */
  readonly error: string | undefined;
}

/** Where a stored item stands in the database queue. */
export interface StoredPosition {
  readonly state: ItemState;
  readonly kind: ItemKind;
  /** Queued items of its kind claimed before it; 0 unless it is queued. */
  readonly aheadInQueue: number;
}

/** Checks an item id; INVALID_ARGUMENT naming it when it is not a UUID. */
export function checkItemId(id: string): void {
  checkId(id);
}

const uuid = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i;

function checkId(id: string): void {
  if (!uuid.test(id)) throw new SlotbrokerError(Code.InvalidArgument, `id: not a UUID: ${shownId(id)}`);
}

// A caller's id as a refusal shows it: at most 40 characters (escaped), so answering a
// 10 KB id never sends 10 KB back.
function shownId(id: string): string {
  return id.length <= 40 ? JSON.stringify(id) : `${JSON.stringify(id.slice(0, 40))}… (${id.length} characters)`;
}

/** Claim order: priority desc, then eligibility time, then submission time. */
export function claimOrder(a: QueueItem, b: QueueItem): number {
  return b.priority - a.priority || a.startAfter.getTime() - b.startAfter.getTime() || a.createdAt.getTime() - b.createdAt.getTime();
}

/** What one sweep of finished rows deleted: rows, and the stored blobs and bytes that went with them. */
export interface SweptItems {
  readonly items: number;
  readonly blobs: number;
  readonly bytes: number;
}

/** Typed access to queue_items and fylrs. */
export class QueueStore {
  constructor(readonly pool: pg.Pool) {}

  private async query<R extends pg.QueryResultRow>(what: string, text: string, params: unknown[] = []): Promise<pg.QueryResult<R>> {
    try {
      return await namedQuery<R>(this.pool, text, params);
    } catch (err) {
      throw fromPgError(err, what);
    }
  }

  /**
   * Inserts an item, or returns the one already holding its idempotency key. With
   * `claimFor`, that fylr claims it in the insert when the claim's rules allow (see
   * sql.insertItem): the item comes back 'claimed', else 'queued'.
   */
  async submit(n: NormalizedSubmit, claimFor?: string): Promise<{ item: QueueItem; created: boolean }> {
    const params = [
      n.kind,
      n.priority,
      JSON.stringify(n.payload),
      n.startAfter ?? null,
      n.maxAttempts,
      n.idempotencyKey ?? null,
      claimFor ?? null,
      n.traceparent ?? null,
      n.fairnessKey ?? "",
      n.fairnessWeight ?? 1,
      n.fairnessLimit ?? null,
    ];
    if (n.uploads && n.uploads.length > 0) return this.submitWithUploads(n, n.uploads, params);
    // ON CONFLICT DO NOTHING waits for a concurrent insert of the same key to commit; the
    // follow-up SELECT runs with a fresh snapshot and therefore sees the winner's row.
    for (let tries = 0; tries < 3; tries++) {
      const inserted = await this.query<InsertedRow>("submit", sql.insertItem, params);
      if (inserted.rows[0]) return { item: insertedItem(inserted.rows[0], n), created: true };
      const existing = await this.query<ItemRow>("submit", sql.selectItemByKey, [n.idempotencyKey]);
      if (existing.rows[0]) return { item: itemFromRow(existing.rows[0]), created: false };
    }
    throw new SlotbrokerError(Code.Aborted, `submit: idempotency key "${n.idempotencyKey}" conflicted but its item vanished`);
  }

  // The insert and the adoption of its uploads in one transaction: an item never refers to
  // an upload it does not own, and a refused adoption leaves no item.
  private async submitWithUploads(n: NormalizedSubmit, uploads: readonly string[], params: unknown[]): Promise<{ item: QueueItem; created: boolean }> {
    const client = await this.pool.connect().catch((err: unknown) => {
      throw fromPgError(err, "submit");
    });
    // A checked-out client has no 'error' listener of the pool's: a server restart between
    // two of these queries would otherwise crash the process (the query fails anyway).
    const ignore = (): void => undefined;
    client.on("error", ignore);
    let healthy = false;
    try {
      await client.query("BEGIN");
      const inserted = (await client.query<InsertedRow>(sql.insertItem, params)).rows[0];
      if (!inserted) {
        // The idempotency key was taken: the first item stands; this upload stays unadopted and expires.
        await client.query("ROLLBACK");
        healthy = true;
        const existing = (await this.query<ItemRow>("submit", sql.selectItemByKey, [n.idempotencyKey])).rows[0];
        if (existing) return { item: itemFromRow(existing), created: false };
        throw new SlotbrokerError(Code.Aborted, `submit: idempotency key "${n.idempotencyKey}" conflicted but its item vanished`);
      }
      const adopted = new Set((await client.query<{ id: string }>(blobSql.adoptUploads, [inserted.id, uploads])).rows.map((r) => r.id));
      const missing = uploads.find((id) => !adopted.has(id));
      if (missing) {
        await client.query("ROLLBACK");
        healthy = true;
        throw new SlotbrokerError(
          Code.FailedPrecondition,
          `calls[0].stdin_upload: no upload ${missing} to take: it never completed, expired unused (store.orphanTtl), or another item took it`,
        );
      }
      await client.query("COMMIT");
      healthy = true;
      return { item: insertedItem(inserted, n), created: true };
    } catch (err) {
      throw fromPgError(err, "submit");
    } finally {
      client.off("error", ignore);
      client.release(!healthy);
    }
  }

  /** One item, or undefined. */
  async get(id: string): Promise<QueueItem | undefined> {
    checkId(id);
    const row = (await this.query<ItemRow>("get", sql.selectItem, [id])).rows[0];
    return row ? itemFromRow(row) : undefined;
  }

  /**
   * Claims up to `limit` eligible items of `kind` with priority ≥ minPriority, in claim
   * order: exec items by priority, then fairness keys in turn, then oldest first within a
   * key; local items by priority, then oldest first.
   */
  async claim(fylrId: string, kind: ItemKind, minPriority: number, limit: number): Promise<ClaimedItem[]> {
    if (limit <= 0) return [];
    if (kind === "exec") {
      const rows = (await this.query<ItemRow>("claim", sql.claimExecItems, [fylrId, minPriority, limit])).rows;
      return rows.map((r) => itemFromRow(r) as ClaimedItem);
    }
    const rows = (await this.query<ItemRow>("claim", sql.claimItems, [fylrId, kind, minPriority, limit])).rows;
    // UPDATE … RETURNING has no order; restore the claim order for FIFO wants.
    return rows.map((r) => itemFromRow(r) as ClaimedItem).sort(claimOrder);
  }

  /**
   * Claims local items straight into 'running': at most `total` items, of which those with
   * priority < highPriority at most `normal` minus the high-priority items claimed along.
   */
  async claimLocal(fylrId: string, limits: { total: number; normal: number; highPriority: number }): Promise<ClaimedItem[]> {
    if (limits.total <= 0) return [];
    const rows = (await this.query<ItemRow>("claim local", sql.claimLocalItems(limits.total), [fylrId, limits.highPriority, limits.total, limits.normal])).rows;
    return rows.map((r) => itemFromRow(r) as ClaimedItem).sort(claimOrder);
  }

  /** claimed → running. False when the fence refused it. */
  async markRunning(fence: Fence): Promise<boolean> {
    return (await this.query("mark running", sql.markRunning, fenceParams(fence))).rowCount === 1;
  }

  /** claimed → running for several items in one statement: one boolean per fence, in order. */
  async markRunningMany(fences: readonly Fence[]): Promise<boolean[]> {
    if (fences.length === 0) return [];
    const r = await this.query<{ n: string }>("mark running many", sql.markRunningMany, [
      fences.map((f) => f.id),
      fences.map((f) => f.claimedBy),
      fences.map((f) => f.lease),
    ]);
    const written = fences.map(() => false);
    for (const row of r.rows) written[Number(row.n) - 1] = true;
    return written;
  }

  /** → succeeded with receipts and output. False when the fence refused it. */
  async complete(fence: Fence, results: readonly CallResult[], output: ItemOutput | undefined): Promise<boolean> {
    const r = await this.query("complete", sql.completeItem, completeParams(fence, results, output));
    return r.rowCount === 1;
  }

  /**
   * → succeeded for several items in one statement. Resolves with one boolean per entry,
   * in order: false where the fence refused it.
   */
  async completeMany(entries: readonly { fence: Fence; results: readonly CallResult[]; output: ItemOutput | undefined }[]): Promise<boolean[]> {
    if (entries.length === 0) return [];
    const r = await this.query<{ id: string; lease: string }>("complete many", sql.completeItems, completeManyParams(entries));
    const written = new Set(r.rows.map((row) => `${row.id}/${row.lease}`));
    return entries.map((e) => written.has(`${e.fence.id}/${e.fence.lease}`));
  }

  /**
   * Records a failed attempt: back to queued after `retryDelayMs` while attempts remain
   * (and not `permanent`), else failed. Returns the new state, or undefined when fenced.
   */
  async failAttempt(
    fence: Fence,
    results: readonly CallResult[],
    error: string,
    retryDelayMs: number,
    permanent: boolean,
  ): Promise<"queued" | "failed" | "cancelled" | undefined> {
    const r = await this.query<{ state: "queued" | "failed" | "cancelled" }>("fail attempt", sql.failAttempt, [
      ...fenceParams(fence),
      storableJsonText(encodeResults(results)),
      storableText(error),
      retryDelayMs,
      permanent,
    ]);
    return r.rows[0]?.state;
  }

  /** → cancelled with the receipts of the stopped run. False when fenced. */
  async finishCancelled(fence: Fence, results: readonly CallResult[], error: string): Promise<boolean> {
    return (await this.query("finish cancelled", sql.finishCancelled, [...fenceParams(fence), encodeResults(results), error])).rowCount === 1;
  }

  /** Back to queued after `delayMs` with the attempt given back (cancelled instead when a cancel is pending). False when fenced. */
  async release(fence: Fence, delayMs: number): Promise<boolean> {
    return (await this.query("release", sql.releaseItem, [...fenceParams(fence), delayMs])).rowCount === 1;
  }

  /** Adds this fylr's row. */
  async registerFylr(reg: FylrRegistration): Promise<void> {
    await this.query("register fylr", sql.registerFylr, [reg.id, reg.hostname, reg.pid, reg.apiUrl ?? null, reg.version ?? null]);
  }

  /** True when migration `version` is applied; false when the ledger cannot be read. */
  async hasMigration(version: number): Promise<boolean> {
    const found = await this.query<{ found: boolean }>("read the migration ledger", sql.migrationApplied, [version]).catch(() => undefined);
    return found?.rows[0]?.found === true;
  }

  /** Touches this fylr's row; false when the row is gone (a sibling declared it dead). */
  async heartbeat(id: string): Promise<boolean> {
    return (await this.query("heartbeat", sql.heartbeatFylr, [id])).rowCount === 1;
  }

  /** Removes this fylr's row. */
  async deregisterFylr(id: string): Promise<void> {
    await this.query("deregister fylr", sql.deregisterFylr, [id]);
  }

  /** Removes stale fylrs and requeues (or, on their last attempt, fails) their claims. */
  async reapStale(staleAfterMs: number, selfId: string): Promise<ReapResult> {
    type Orphan = { id: string; state: "queued" | "failed" | "cancelled"; claimedBy: string };
    const row = (await this.query<{ dead: string[]; orphans: Orphan[] }>("reap stale claims", sql.reapStale, [staleAfterMs, selfId])).rows[0];
    const orphans = row?.orphans ?? [];
    return {
      deadFylrs: row?.dead ?? [],
      requeued: orphans.filter((o) => o.state === "queued").map(({ id, claimedBy }) => ({ id, claimedBy })),
      failed: orphans.filter((o) => o.state === "failed").map(({ id, claimedBy }) => ({ id, claimedBy })),
      cancelled: orphans.filter((o) => o.state === "cancelled").map(({ id, claimedBy }) => ({ id, claimedBy })),
    };
  }

  /**
   * Deletes up to `limit` finished rows that finished more than `retentionMs` ago, oldest
   * first, with their stored data; rows another sweeper is deleting are skipped.
   */
  async sweepFinished(retentionMs: number, limit: number): Promise<SweptItems> {
    const row = (await this.query<{ items: number; blobs: number; bytes: string }>("sweep finished items", sql.sweepFinishedItems, [retentionMs, limit])).rows[0];
    return { items: row?.items ?? 0, blobs: row?.blobs ?? 0, bytes: Number(row?.bytes ?? 0) };
  }

  /** State and queue position of an item, or undefined. */
  async position(id: string): Promise<StoredPosition | undefined> {
    checkId(id);
    const row = (await this.query<{ state: ItemState; kind: ItemKind; ahead: string }>("position", sql.itemPosition, [id])).rows[0];
    return row ? { state: row.state, kind: row.kind, aheadInQueue: Number(row.ahead) } : undefined;
  }

  /** Unfinished items by kind and state. */
  async countOpen(): Promise<{ kind: ItemKind; state: ItemState; count: number }[]> {
    const rows = (await this.query<{ kind: ItemKind; state: ItemState; n: number }>("count open", sql.countOpen)).rows;
    return rows.map((r) => ({ kind: r.kind, state: r.state, count: r.n }));
  }

  /** Open items of all fylrs by kind, state and priority. */
  async openItemsByPriority(): Promise<OpenItemCount[]> {
    type Row = { kind: ItemKind; state: ItemState; priority: number; n: number };
    const rows = (await this.query<Row>("open items by priority", sql.openItemsByPriority)).rows;
    return rows.map((r) => ({ kind: r.kind, state: r.state, priority: r.priority, count: r.n }));
  }

  /** Fairness keys with open items, most queued first (at most `limit`), and how many keys have queued items. */
  async keyCounts(limit: number): Promise<{ keys: KeyCount[]; keysQueued: number }> {
    type Row = { fairness_key: string; queued: number; held: number; oldest: Date | null; keys_queued: number };
    const rows = (await this.query<Row>("key counts", sql.keyCounts, [limit])).rows;
    return {
      keys: rows.map((r) => ({ fairnessKey: r.fairness_key, queued: r.queued, held: r.held, oldestQueued: r.oldest ?? undefined })),
      keysQueued: rows[0]?.keys_queued ?? 0,
    };
  }

  /** Keys with a claim turn now (exec items queued at some priority). */
  async countKeyTurns(): Promise<number> {
    return (await this.query<{ n: number }>("count key turns", sql.countKeyTurns)).rows[0]?.n ?? 0;
  }

  /** Summaries of the items with these ids (missing ids are left out). */
  async itemSummaries(ids: readonly string[]): Promise<ItemSummary[]> {
    if (ids.length === 0) return [];
    ids.forEach(checkId);
    type Row = {
      id: string;
      kind: ItemKind;
      priority: number;
      fairness_key: string;
      state: ItemState;
      attempts: number;
      claimed_by: string | null;
      updated_at: Date;
      error: string | null;
    };
    const rows = (await this.query<Row>("item summaries", sql.itemSummariesById, [ids])).rows;
    return rows.map((r) => ({
      id: r.id,
      kind: r.kind,
      priority: r.priority,
      fairnessKey: r.fairness_key,
      state: r.state,
      attempts: r.attempts,
      claimedBy: r.claimed_by ?? undefined,
      updatedAt: r.updated_at,
      error: r.error ?? undefined,
    }));
  }

  /** Live fylrs with their holdings. */
  async listFylrs(): Promise<FylrRow[]> {
    type Row = { id: string; hostname: string; pid: number; api_url: string | null; started_at: Date; heartbeat_at: Date; held: number };
    const rows = (await this.query<Row>("list fylrs", sql.listFylrs)).rows;
    return rows.map((r) => ({
      id: r.id,
      hostname: r.hostname,
      pid: r.pid,
      apiUrl: r.api_url ?? undefined,
      startedAt: r.started_at,
      heartbeatAt: r.heartbeat_at,
      held: r.held,
    }));
  }
}

/** $1–$8 of completeItem (sql.ts). */
export function completeParams(fence: Fence, results: readonly CallResult[], output: ItemOutput | undefined): unknown[] {
  const o = outputParams(output);
  return [...fenceParams(fence), storableJsonText(encodeResults(results)), o.bytes, o.blob, o.size, o.sha256];
}

/** $1–$8 of completeItems (sql.ts): one array per column. */
export function completeManyParams(entries: readonly { fence: Fence; results: readonly CallResult[]; output: ItemOutput | undefined }[]): unknown[] {
  const outputs = entries.map((e) => outputParams(e.output));
  return [
    entries.map((e) => e.fence.id),
    entries.map((e) => e.fence.claimedBy),
    entries.map((e) => e.fence.lease),
    entries.map((e) => storableJsonText(encodeResults(e.results))),
    outputs.map((o) => o.bytes),
    outputs.map((o) => o.blob),
    outputs.map((o) => o.size),
    outputs.map((o) => o.sha256),
  ];
}

function outputParams(output: ItemOutput | undefined): { bytes: Buffer | null; blob: string | null; size: number | null; sha256: string | null } {
  if (!output) return { bytes: null, blob: null, size: null, sha256: null };
  return { bytes: output.bytes, blob: output.blobId ?? null, size: output.size, sha256: output.sha256 };
}

function fenceParams(fence: Fence): [string, string, number] {
  return [fence.id, fence.claimedBy, fence.lease];
}

/**
 * Text from peers made storable in Postgres. A receipt's stderr line or error message is
 * whatever a job or an execserver wrote: a NUL character or a lone UTF-16 surrogate in it
 * is refused by `text` and `jsonb` columns alike, and an outcome that cannot be written
 * would leave its item claimed for as long as the fylr lives. Both become U+FFFD.
 */
// eslint-disable-next-line no-control-regex -- NUL is exactly what must go
const unstorable = /\u0000|[\ud800-\udbff](?![\udc00-\udfff])|(?<![\ud800-\udbff])[\udc00-\udfff]/g;

/** `s` with NUL characters and lone surrogates replaced by U+FFFD. */
export function storableText(s: string): string {
  return s.replace(unstorable, "\ufffd");
}

// In JSON text, JSON.stringify writes a NUL and a lone surrogate as these escapes (and
// nothing else as them but a backslash written before such letters, a harmless false alarm).
const unstorableEscape = /\\u0000|\\ud[89a-f]/;

/**
 * The JSON text of `value` made storable: the text as it is when nothing in it needs a
 * replacement (no walk and copy of the value, the common case), else storableJson's.
 */
export function storableJsonText(value: unknown): string {
  const text = JSON.stringify(value);
  return unstorableEscape.test(text) ? JSON.stringify(storableJson(value)) : text;
}

/** A JSON value with every string (keys included) made storable. */
export function storableJson<T>(value: T): T {
  if (typeof value === "string") return storableText(value) as T;
  if (Array.isArray(value)) return value.map((v: unknown) => storableJson(v)) as T;
  if (value !== null && typeof value === "object") {
    return Object.fromEntries(Object.entries(value).map(([k, v]) => [storableText(k), storableJson(v as unknown)])) as T;
  }
  return value;
}
