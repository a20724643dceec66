/**
 * Group insert of queued submits. Under load most submits are queued (the fylr's exec share
 * is taken, so none is claimed in its insert), and each cost its own INSERT, commit and
 * 'queued' notification. A submit arriving while fewer than two inserts are on their way
 * goes at once with the single-row statement, exactly as before, so a lone submit never
 * waits; those arriving while two are go together in the next statement, in arrival order.
 * (With one on its way at most, answers under load came later: each waited for the whole
 * group ahead of it.)
 * An entry whose idempotency key turns out taken goes again on its own through the
 * single-row path, which finds the key's holder. A group statement refused for its data (a
 * value some entry holds: nothing was inserted) sends every entry again on its own, so only
 * the bad one fails; any other failure (the database unreachable, or an answer that never
 * came, when the insert may have committed) fails them all, as it would have failed each.
 */
import { randomUUID } from "node:crypto";
import { itemFromRow, type ItemRow, type NormalizedSubmit } from "./payload.js";
import { fromPgError, sqlState } from "./pg-errors.js";
import { insertQueuedItems } from "./sql.js";
import { statementName, type QueueStore } from "./store.js";
import type { QueueItem } from "./types.js";

/** What a submit resolves with (QueueStore.submit's answer). */
export type SubmitResult = { item: QueueItem; created: boolean };

interface Pending {
  readonly n: NormalizedSubmit;
  readonly resolve: (result: SubmitResult) => void;
  readonly reject: (err: unknown) => void;
}

/** Inserts queued submits, grouped while one insert is on its way. */
export class SubmitBatcher {
  private pending: Pending[] = [];
  private inFlight = 0;

  constructor(
    private readonly store: QueueStore,
    private readonly maxInFlight = 2,
    private readonly maxBatch = 100,
  ) {}

  /** Inserts a submit queued (never claimed in its insert), or finds its key's holder. */
  submit(n: NormalizedSubmit): Promise<SubmitResult> {
    // The adoption of uploads needs a transaction of its own.
    if (n.uploads && n.uploads.length > 0) return this.store.submit(n);
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

  private async write(batch: Pending[]): Promise<void> {
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

  private alone(p: Pending): Promise<void> {
    return this.store.submit(p.n).then(p.resolve, p.reject);
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
    ];
    const { rows } = await this.store.pool.query<ItemRow>({ name: statementName(insertQueuedItems), text: insertQueuedItems, values });
    return new Map(rows.map((row) => [row.id, itemFromRow(row)]));
  }
}
