/**
 * Group commit: writes that arrive together go to Postgres in one statement. Items change
 * state one by one, but writing each change in its own statement makes the commit (and the
 * NOTIFY trigger it fires) the bottleneck of a busy fylr. Entries that arrive while a batch
 * is being written wait for it and go together in the next one, so one entry alone still
 * costs one round trip and a burst costs one round trip per batch; each entry keeps its own
 * lease fence inside the batch statement. Three writes go this way: successes (which may
 * carry the next claim), the claimed → running mark of exec items whose slot came, and
 * queued submits.
 */
import { randomUUID } from "node:crypto";
import type pg from "pg";
import type { ItemOutput } from "../blobs/output-sink.js";
import type { CallResult, ClaimedItem, Fence, QueueItem } from "../types.js";
import { insertedItem, itemFromRow, type InsertedRow, type ItemRow, type NormalizedSubmit } from "./payload.js";
import { fromPgError, isTransient, sqlState } from "./pg-errors.js";
import { namedQuery } from "./named-query.js";
import { claimOrder, completeManyParams, completeParams, type QueueStore } from "./queue-store.js";
import * as sql from "./sql.js";

interface Pending<T> {
  readonly entry: T;
  readonly resolve: (written: boolean) => void;
  readonly reject: (err: unknown) => void;
}

/** Writes entries in batches; at most one batch statement in flight. */
export class GroupWriter<T> {
  private pending: Pending<T>[] = [];
  private scheduled: NodeJS.Immediate | undefined;
  private inFlight: Promise<void> | undefined;

  /** `write` answers one boolean per entry, in order: false where the fence refused it. */
  constructor(
    private readonly write: (batch: readonly T[]) => Promise<boolean[]>,
    private readonly maxBatch = 200,
  ) {}

  /** Resolves with whether this entry was written (false: the fence refused it). */
  add(entry: T): Promise<boolean> {
    return new Promise((resolve, reject) => {
      this.pending.push({ entry, resolve, reject });
      this.schedule();
    });
  }

  private schedule(): void {
    if (this.inFlight || this.scheduled) return;
    // setImmediate: entries added in the same turn of the event loop share a batch.
    this.scheduled = setImmediate(() => {
      this.scheduled = undefined;
      this.inFlight = this.flush().finally(() => {
        this.inFlight = undefined;
        if (this.pending.length > 0) this.schedule();
      });
    });
  }

  private async flush(): Promise<void> {
    const batch = this.pending.splice(0, this.maxBatch);
    try {
      const written = await this.write(batch.map((p) => p.entry));
      batch.forEach((p, i) => p.resolve(written[i] ?? false));
    } catch (err) {
      // Every caller retries on its own (transient errors) or reports the failure.
      for (const p of batch) p.reject(err);
    }
  }
}

// --- successes, and the claim they carry ---------------------------------------------
//
// Completions that carry the next claim. Under a backlog every finished exec item freed a
// place, and the claim pass it woke sent a claim statement right after the completion's:
// two statements, two commits and two round trips per item. Here the claim rides in the
// completion's own statement (one transaction): the completion is fenced exactly as
// alone, and the claim takes the same rows, in the same order, with the same fylr-row
// check as claimExecItems (sql.ts). The two touch disjoint rows (held vs queued).

/** One success to write. */
export interface Completion {
  readonly fence: Fence;
  readonly results: readonly CallResult[];
  readonly output: ItemOutput | undefined;
  /** An exec item's: gives up its place in the exec admission (once the write landed). */
  readonly freePlace: (() => void) | undefined;
  /** A local item's: gives its local permit back (once the write landed). */
  readonly freePermit?: (() => void) | undefined;
}

/**
 * The claim that goes along: up to `limit` exec items for `fylrId`, or with `local` up to
 * `limit` local items under the permits' rule (sql.claimLocalItems).
 */
export interface ClaimAlong {
  readonly fylrId: string;
  readonly limit: number;
  readonly local?: { readonly normal: number; readonly highPriority: number };
}

/**
 * completeItem (one completion) or completeItems (`many`, sql.ts) and the claim `claim`
 * (CTEs ending in `claimed`), in one statement. One row at least: `done` and the claimed
 * item's columns, all null when nothing was claimed. `done` of one completion: 1 when the
 * fence let it through, else 0; of many: the "id/lease" texts of those the fences let through.
 */
function completeWithClaim(many: boolean, claim: string): string {
  return many
    ? `
WITH ${sql.completeItemsCtes}, ${claim}
SELECT d.done, k.* FROM (SELECT coalesce(array_agg(id::text || '/' || lease::text), '{}') AS done FROM done) d LEFT JOIN claimed k ON true`
    : `
WITH ${sql.completeItemCtes}, ${claim}
SELECT d.done, k.* FROM (SELECT count(*)::int AS done FROM done) d LEFT JOIN claimed k ON true`;
}

const execClaim = sql.claimCtes("$9::text", "(-2147483648)::integer", "$10::integer");
/** completeItem and an exec claim: $1–$8 as completeItem, $9 the fylr, $10 the limit. */
export const completeItemAndClaim = completeWithClaim(false, execClaim);
/** completeItems and an exec claim: $1–$8 as completeItems, $9 the fylr, $10 the limit. */
export const completeItemsAndClaim = completeWithClaim(true, execClaim);

/** completeItem(s) and a local claim: $1–$8 as those, $9 the fylr, $10 the high priority, $11 the total, $12 the normal permits. */
const localTexts = new Map<string, string>();
function completeAndClaimLocal(many: boolean, most: number): string {
  const key = `${many}/${sql.claimLocalLimit(most)}`;
  let text = localTexts.get(key);
  if (!text) {
    text = completeWithClaim(many, sql.claimLocalCtes("$9::text", "$10::integer", "$11::integer", "$12::integer", most));
    localTexts.set(key, text);
  }
  return text;
}

type Row = Partial<ItemRow> & { done: number | string[]; ordinality?: string | number | null };

/** Writes the completions and claims; one boolean per completion (false: fenced) and the items claimed, in claim order. */
export async function completeAndClaim(pool: pg.Pool, entries: readonly Completion[], claim: ClaimAlong): Promise<{ written: boolean[]; items: ClaimedItem[] }> {
  const only = entries.length === 1 ? entries[0]! : undefined;
  const local = claim.local;
  const text = local ? completeAndClaimLocal(!only, claim.limit) : only ? completeItemAndClaim : completeItemsAndClaim;
  const params = [
    ...(only ? completeParams(only.fence, only.results, only.output) : completeManyParams(entries)),
    ...(local ? [claim.fylrId, local.highPriority, claim.limit, local.normal] : [claim.fylrId, claim.limit]),
  ];
  let rows: Row[];
  try {
    rows = (await namedQuery<Row>(pool, text, params)).rows;
  } catch (err) {
    throw fromPgError(err, "complete and claim");
  }
  const done = rows[0]?.done;
  const written = Array.isArray(done)
    ? ((set) => entries.map((e) => set.has(`${e.fence.id}/${e.fence.lease}`)))(new Set(done))
    : entries.map(() => done === 1);
  const claimed = rows.filter((r) => r.id != null);
  if (local) return { written, items: claimed.map((r) => itemFromRow(r as ItemRow) as ClaimedItem).sort(claimOrder) };
  claimed.sort((a, b) => Number(a.ordinality) - Number(b.ordinality));
  return { written, items: claimed.map((r) => itemFromRow(r as ItemRow) as ClaimedItem) };
}

/** A claim booked to ride along with a completion write. */
export interface Boarding extends ClaimAlong {
  /** The write went through with these items claimed. */
  landed(items: readonly ClaimedItem[]): void;
  /** The write failed: nothing was claimed. */
  missed(): void;
}

/** Decides whether a claim goes along with completions that free `freed` exec places and `freedPermits` local permits. */
export interface ClaimRider {
  board(freed: number, freedPermits: number): Boarding | undefined;
}

/** Batches `complete` writes. */
export class CompletionBatcher {
  private readonly writer: GroupWriter<Completion>;
  /** Set once the claim pass exists; without it completions go alone. */
  rider: ClaimRider | undefined;

  constructor(queue: QueueStore, maxBatch = 200) {
    // A batch of one (the common case below full load) takes the single-row statement: no
    // arrays to build and quote, no unnest; half the fylr's CPU of the write.
    const alone = async (batch: readonly Completion[]): Promise<boolean[]> => {
      const only = batch.length === 1 ? batch[0]! : undefined;
      return only ? [await queue.complete(only.fence, only.results, only.output)] : queue.completeMany(batch);
    };
    this.writer = new GroupWriter(async (batch) => {
      const freed = batch.reduce((n, e) => n + (e.freePlace ? 1 : 0), 0);
      const freedPermits = batch.reduce((n, e) => n + (e.freePermit ? 1 : 0), 0);
      const boarding = freed > 0 || freedPermits > 0 ? this.rider?.board(freed, freedPermits) : undefined;
      if (!boarding) return alone(batch);
      let result;
      try {
        result = await completeAndClaim(queue.pool, batch, boarding);
      } catch (err) {
        boarding.missed();
        // Transient: the caller retries. Anything else the claim may have caused must not
        // keep the successes from being written: they go alone.
        if (isTransient(err)) throw err;
        return alone(batch);
      }
      // The written items' places and permits are given up before the claimed ones take
      // them: the admission and the permits never count both.
      for (const e of batch) {
        e.freePlace?.();
        e.freePermit?.();
      }
      boarding.landed(result.items);
      return result.written;
    }, maxBatch);
  }

  /**
   * Marks an item succeeded; resolves false when the lease fence refused it. An exec item
   * passes `freePlace`, a local one `freePermit`: a write that claims along gives its
   * admission place or its permit up with it.
   */
  complete(fence: Fence, results: readonly CallResult[], output: ItemOutput | undefined, freePlace?: () => void, freePermit?: () => void): Promise<boolean> {
    return this.writer.add({ fence, results, output, freePlace, freePermit });
  }
}

// --- claimed → running marks ---------------------------------------------------------

/** Batches claimed → running writes: one statement (and one notification) per burst. */
export class RunningBatcher {
  private readonly writer: GroupWriter<Fence>;

  constructor(queue: QueueStore, maxBatch = 200) {
    this.writer = new GroupWriter((batch) => queue.markRunningMany(batch), maxBatch);
  }

  /** claimed → running; resolves false when the lease fence refused it. */
  markRunning(fence: Fence): Promise<boolean> {
    return this.writer.add(fence);
  }
}

// --- queued submits ------------------------------------------------------------------
//
// Group insert of queued submits. Under load most submits are queued (the fylr's exec share
// is taken, so none is claimed in its insert), and each cost its own INSERT, commit and
// 'queued' notification. A submit arriving while fewer than two inserts are on their way
// goes at once with the single-row statement, exactly as before, so a lone submit never
// waits; those arriving while two are go together in the next statement, in arrival order.
// (With one on its way at most, answers under load came later: each waited for the whole
// group ahead of it.)
// An entry whose idempotency key turns out taken goes again on its own through the
// single-row path, which finds the key's holder. A group statement refused for its data (a
// value some entry holds: nothing was inserted) sends every entry again on its own, so only
// the bad one fails; any other failure (the database unreachable, or an answer that never
// came, when the insert may have committed) fails them all, as it would have failed each.

/** What a submit resolves with (QueueStore.submit's answer). */
export type SubmitResult = { item: QueueItem; created: boolean };

interface PendingSubmit {
  readonly n: NormalizedSubmit;
  readonly resolve: (result: SubmitResult) => void;
  readonly reject: (err: unknown) => void;
}

/** Inserts queued submits, grouped while one insert is on its way. */
export class SubmitBatcher {
  private pending: PendingSubmit[] = [];
  private inFlight = 0;

  constructor(
    private readonly queue: QueueStore,
    private readonly maxInFlight = 2,
    private readonly maxBatch = 100,
  ) {}

  /** Inserts a submit queued (never claimed in its insert), or finds its key's holder. */
  submit(n: NormalizedSubmit): Promise<SubmitResult> {
    // The adoption of uploads needs a transaction of its own.
    if (n.uploads && n.uploads.length > 0) return this.queue.submit(n);
    return new Promise((resolve, reject) => {
      this.pending.push({ n, resolve, reject });
      if (this.inFlight < this.maxInFlight) this.flush();
    });
  }

  private flush(): void {
    const batch = this.pending.splice(0, this.maxBatch);
    if (batch.length === 0) return;
    this.inFlight += 1;
    void this.write(batch)
      .catch((err: unknown) => {
        for (const p of batch) p.reject(err); // those already settled keep their answer
      })
      .finally(() => {
        this.inFlight -= 1;
        this.flush();
      });
  }

  private async write(batch: PendingSubmit[]): Promise<void> {
    if (batch.length === 1) return this.alone(batch[0]!);
    const entries = batch.map((p) => ({ id: randomUUID(), p }));
    let inserted: Map<string, QueueItem>;
    try {
      inserted = await this.insertMany(entries.map(({ id, p }) => ({ id, n: p.n })));
    } catch (err) {
      const state = sqlState(err);
      // Classes 22 (data exception) and 23 (integrity): refused while executing, before any commit.
      if (state?.startsWith("22") || state?.startsWith("23")) await Promise.all(batch.map((p) => this.alone(p)));
      else for (const p of batch) p.reject(fromPgError(err, "submit"));
      return;
    }
    const again: Promise<void>[] = [];
    for (const { id, p } of entries) {
      const item = inserted.get(id);
      if (item) p.resolve({ item, created: true });
      else again.push(this.alone(p));
    }
    await Promise.all(again);
  }

  private alone(p: PendingSubmit): Promise<void> {
    return this.queue.submit(p.n).then(p.resolve, p.reject);
  }

  private async insertMany(entries: readonly { id: string; n: NormalizedSubmit }[]): Promise<Map<string, QueueItem>> {
    const values = [
      entries.map((e) => e.id),
      entries.map((e) => e.n.kind),
      entries.map((e) => e.n.priority),
      entries.map((e) => JSON.stringify(e.n.payload)),
      entries.map((e) => e.n.startAfter ?? null),
      entries.map((e) => e.n.maxAttempts),
      entries.map((e) => e.n.idempotencyKey ?? null),
      entries.map((e) => e.n.traceparent ?? null),
      entries.map((e) => e.n.fairnessKey ?? ""),
      entries.map((e) => e.n.fairnessWeight ?? 1),
      entries.map((e) => e.n.fairnessLimit ?? null),
    ];
    const { rows } = await namedQuery<InsertedRow>(this.queue.pool, sql.insertQueuedItems, values);
    const submits = new Map(entries.map((e) => [e.id, e.n]));
    return new Map(rows.map((row) => [row.id, insertedItem(row, submits.get(row.id)!)]));
  }
}
