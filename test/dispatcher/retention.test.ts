// The retention of finished item rows (queue.retention), against a real Postgres: the
// config key, the sweep statement (batches, what stays, its plan, stored data going along
// with the store's accounting), two fylrs sweeping at once, and a table that stops growing
// under a long run of claims and completions.
import { expect } from "chai";
import type pg from "pg";
import { compileFylrConfig } from "../../src/app/index.js";
import {
  BlobStore,
  compileQueueConfig,
  finishedSweepBatch,
  ManualCapacitySource,
  migrate,
  QueueStore,
  storeConfig,
  type ClaimedItem,
  type Dispatcher,
  type ExecBackend,
} from "../../src/dispatcher/index.js";
import { sweepFinishedItems } from "../../src/dispatcher/queue/sql.js";
import { ConfigError } from "../../src/shared/errors.js";
import { setTimeout as sleep } from "node:timers/promises";
import { awaitCondition, eventsOf } from "../support/event-monitor.js";
import { createTestDatabase } from "../support/postgres.js";
import { closeAll, openPool, receiptFor, startDispatcher } from "./support.js";

const noExec: ExecBackend = { run: () => Promise.reject(new Error("no exec items in this test")) };
const payload = JSON.stringify({ calls: [{ service: "true", args: [], env: {} }] });

/** `n` rows in `state`, finished `agoMs` ago (open states: not finished). Returns their ids. */
async function insertRows(pool: pg.Pool, n: number, state: string, agoMs: number): Promise<string[]> {
  const finished = ["succeeded", "failed", "cancelled"].includes(state);
  const rows = await pool.query<{ id: string }>(
    `INSERT INTO queue_items (kind, payload, state, claimed_by, finished_at)
     SELECT 'exec', $1, $2, CASE WHEN $2 IN ('queued') THEN NULL ELSE 'old-fylr' END,
            CASE WHEN $3 THEN now() - $4::double precision * interval '1 millisecond' END
     FROM generate_series(1, $5) RETURNING id`,
    [payload, state, finished, agoMs, n],
  );
  return rows.rows.map((r) => r.id);
}

async function count(pool: pg.Pool, where = "true"): Promise<number> {
  return (await pool.query<{ n: number }>(`SELECT count(*)::int AS n FROM queue_items WHERE ${where}`)).rows[0]!.n;
}

describe("queue retention", () => {
  let url: string;
  let pool: pg.Pool;

  before(async () => {
    url = await createTestDatabase("retention");
    await migrate(url);
    pool = openPool(url, 6);
  });
  beforeEach(async () => {
    await pool.query("TRUNCATE queue_items, fylrs, blobs, blob_reservations CASCADE");
    await pool.query("UPDATE blob_usage SET stored = 0");
  });
  after(async () => {
    await closeAll(pool);
  });

  it("validates queue.retention and queue.sweepInterval, naming the key", () => {
    expect(compileQueueConfig({})).to.deep.equal({ retentionMs: 7 * 86_400_000, sweepIntervalMs: 60_000 });
    expect(compileQueueConfig({ retention: "off" }).retentionMs).to.equal(undefined);
    expect(compileQueueConfig({ retention: "36h", sweepInterval: "10s" })).to.deep.equal({ retentionMs: 36 * 3_600_000, sweepIntervalMs: 10_000 });
    const bad: [unknown, RegExp][] = [
      [{ retention: "0s" }, /retention: must be longer than 0, or "off"/],
      [{ retention: "7 weeks" }, /retention: expected a duration with a unit such as "7d" or "12h", or "off", got "7 weeks"/],
      [{ retention: 7 }, /retention/],
      [{ sweepInterval: "0ms" }, /sweepInterval: must be longer than 0/],
      [{ keep: "7d" }, /unknown key "keep"/],
    ];
    for (const [raw, message] of bad) expect(() => compileQueueConfig(raw), JSON.stringify(raw)).to.throw(ConfigError, message);
    const fylr = (queue: unknown) => compileFylrConfig({ databaseUrl: "postgres://x/y", execserver: { addresses: ["127.0.0.1:7600"] }, queue }, "fylr.yaml");
    expect(fylr({ retention: "30d" }).queue.retentionMs).to.equal(30 * 86_400_000);
    expect(fylr(undefined).queue.retentionMs).to.equal(7 * 86_400_000);
    expect(() => fylr({ retention: "soon" })).to.throw(ConfigError, /fylr\.yaml: queue\.retention: expected a duration/);
  });

  it("deletes finished rows past the retention in bounded batches, oldest first; newer and open rows stay", async () => {
    const queue = new QueueStore(pool);
    const due = [...(await insertRows(pool, 150, "succeeded", 3_600_000)), ...(await insertRows(pool, 60, "failed", 7_200_000)), ...(await insertRows(pool, 40, "cancelled", 5_400_000))];
    const recent = await insertRows(pool, 30, "succeeded", 1_000);
    const open = [...(await insertRows(pool, 20, "queued", 0)), ...(await insertRows(pool, 5, "claimed", 0)), ...(await insertRows(pool, 5, "running", 0))];
    // An open row that finished once (a retry put it back) is not finished now.
    await pool.query("UPDATE queue_items SET finished_at = now() - interval '10 days' WHERE id = ANY($1::uuid[])", [open.slice(0, 3)]);

    const first = await queue.sweepFinished(60_000, 100);
    expect(first).to.deep.equal({ items: 100, blobs: 0, bytes: 0 });
    // Oldest first: the failed rows (2 h) and the cancelled ones (1.5 h) went before any succeeded row.
    expect(await count(pool, "state IN ('failed', 'cancelled')")).to.equal(0);
    expect((await queue.sweepFinished(60_000, 100)).items).to.equal(100);
    expect((await queue.sweepFinished(60_000, 100)).items).to.equal(50);
    expect((await queue.sweepFinished(60_000, 100)).items).to.equal(0);

    const left = new Set((await pool.query<{ id: string }>("SELECT id FROM queue_items")).rows.map((r) => r.id));
    expect(due.filter((id) => left.has(id))).to.deep.equal([]);
    expect([...recent, ...open].every((id) => left.has(id))).to.equal(true);
    expect(left.size).to.equal(recent.length + open.length);
  });

  it("deletes the stored data of a swept item and keeps the store's usage counter right", async () => {
    const store = new BlobStore(pool, storeConfig({ chunkBytes: 64 * 1024 }), "test-fylr");
    const queue = new QueueStore(pool);
    const [old] = await insertRows(pool, 1, "succeeded", 3_600_000);
    const [recent] = await insertRows(pool, 1, "succeeded", 0);
    const sizes = [200_000, 70_000, 5_000];
    for (const [i, itemId] of [old, old, recent].entries()) {
      const writer = store.createWriter({ role: "output", itemId });
      writer.end(Buffer.alloc(sizes[i]!, i));
      await new Promise<void>((resolve, reject) => writer.on("finish", resolve).on("error", reject));
    }
    // Adopted, as a completion would: no expiry, so only the item's own deletion removes them.
    await pool.query("UPDATE blobs SET expires_at = NULL");
    const usage = async () => Number((await pool.query<{ stored: string }>("SELECT stored FROM blob_usage")).rows[0]!.stored);
    expect(await usage()).to.equal(275_000);

    expect(await queue.sweepFinished(60_000, 10)).to.deep.equal({ items: 1, blobs: 2, bytes: 270_000 });
    expect(await usage()).to.equal(5_000);
    expect((await pool.query<{ n: number }>("SELECT count(*)::int AS n FROM blobs")).rows[0]!.n).to.equal(1);
    expect((await pool.query<{ n: number }>("SELECT count(*)::int AS n FROM blob_chunks c JOIN blobs b ON b.id = c.blob_id WHERE b.item_id = $1", [recent])).rows[0]!.n).to.equal(1);
    expect((await pool.query<{ n: number }>("SELECT count(*)::int AS n FROM blob_chunks")).rows[0]!.n).to.equal(1);
  });

  it("reads the finished rows through their partial index, never the whole table", async () => {
    // Enough rows, most of them open, that a sequential scan would be the worse plan.
    await pool.query(`
      INSERT INTO queue_items (kind, payload, state, claimed_by, finished_at)
      SELECT 'exec', '{"calls":[]}', CASE WHEN g % 10 = 0 THEN 'succeeded' ELSE 'queued' END,
             CASE WHEN g % 10 = 0 THEN 'old-fylr' END, CASE WHEN g % 10 = 0 THEN now() - g * interval '1 second' END
      FROM generate_series(1, 20000) g`);
    // …and a stored blob for most of them: the swept rows' blobs are looked up by item.
    await pool.query(`INSERT INTO blobs (item_id, role, size, sha256, chunk_bytes) SELECT id, 'input', 10, '', 65536 FROM queue_items WHERE seq % 10 <> 3`);
    await pool.query("ANALYZE queue_items, blobs");
    const plan = (await pool.query<{ "QUERY PLAN": string }>(`EXPLAIN ${sweepFinishedItems}`, [60_000, finishedSweepBatch])).rows.map((r) => r["QUERY PLAN"]).join("\n");
    expect(plan, plan).to.match(/Index Scan using queue_items_finished_idx on queue_items/);
    expect(plan, plan).to.match(/Index Scan using queue_items_pkey on queue_items|Bitmap Index Scan on queue_items_pkey/);
    expect(plan, plan).to.match(/Index Scan using blobs_item_idx on blobs|Bitmap Index Scan on blobs_item_idx/);
    expect(plan, plan).to.not.match(/Seq Scan/);
    expect(plan, plan).to.not.match(/Sort/);
  });

  it("two fylrs sweeping at once delete and count each row once, without an error", async function () {
    this.timeout(60_000);
    const n = 5 * finishedSweepBatch + 123;
    await insertRows(pool, n, "succeeded", 3_600_000);
    const recent = await insertRows(pool, 40, "failed", 0);
    const fylrs: Dispatcher[] = [];
    const pools = [openPool(url, 4), openPool(url, 4)];
    for (const own of pools) {
      fylrs.push(
        await startDispatcher({
          pool: own,
          capacity: new ManualCapacitySource(),
          backend: noExec,
          config: { heartbeatIntervalMs: 50, staleAfterMs: 5_000 },
          queue: { retentionMs: 60_000, sweepIntervalMs: 20 },
        }),
      );
    }
    const deleted = () => fylrs.reduce((sum, d) => sum + d.stats().counters.finishedDeleted, 0);
    const beat = eventsOf(fylrs[0]!.events, "heartbeat");
    await awaitCondition("both fylrs to have swept", [beat], async () => ((await count(pool)) === recent.length && deleted() === n ? true : undefined), 30_000);
    // Several more rounds each (a sweep starts with every fifth beat or so): nothing left to delete, nothing counted twice.
    const beats = fylrs.map(() => 0);
    fylrs.forEach((d, i) => d.events.on("heartbeat", () => (beats[i]! += 1)));
    await awaitCondition("more housekeeping rounds", [beat], () => (beats.every((b) => b >= 10) ? true : undefined), 10_000);
    expect(deleted()).to.equal(n);
    expect(await count(pool)).to.equal(recent.length);
    await closeAll(...fylrs, ...pools);
  });

  it("keeps the table and its indexes bounded under a long run of claims and completions", async function () {
    this.timeout(120_000);
    const queue = new QueueStore(pool);
    const retentionMs = 500;
    const perRound = 1000;
    const rounds = 16;
    const sizes: { rows: number; bytes: number }[] = [];
    let previousRoundDone = 0;
    await queue.registerFylr({ id: "fylr-a", hostname: "here", pid: process.pid });
    for (let round = 0; round < rounds; round++) {
      // A round of work through the real claim and completion statements.
      await pool.query("INSERT INTO queue_items (kind, payload) SELECT 'exec', $1 FROM generate_series(1, $2)", [payload, perRound]);
      for (let done = 0; done < perRound; ) {
        const claimed: ClaimedItem[] = await queue.claim("fylr-a", "exec", -2147483648, 100);
        const written = await queue.completeMany(claimed.map((item) => ({ fence: { id: item.id, claimedBy: item.claimedBy, lease: item.lease }, results: [{ service: "true", receipt: receiptFor({}) }], output: undefined })));
        expect(written.every(Boolean)).to.equal(true);
        done += claimed.length;
      }
      // Wait, by the database's clock, until every row of the round before is past the
      // retention: then the sweep must leave at most this round's rows, however slow the machine.
      const roundDone = (await pool.query<{ t: number }>("SELECT (extract(epoch FROM max(finished_at)) * 1000)::float8 AS t FROM queue_items")).rows[0]!.t;
      for (;;) {
        const now = (await pool.query<{ t: number }>("SELECT (extract(epoch FROM now()) * 1000)::float8 AS t")).rows[0]!.t;
        const left = previousRoundDone + retentionMs - now;
        if (left < 0) break;
        await sleep(left + 1);
      }
      previousRoundDone = roundDone;
      while ((await queue.sweepFinished(retentionMs, finishedSweepBatch)).items === finishedSweepBatch);
      // What autovacuum does on a busy table, run here at a fixed point so sizes compare.
      await pool.query("VACUUM queue_items");
      const rows = await count(pool);
      expect(rows, `rows after round ${round}`).to.be.at.most(perRound);
      sizes.push({ rows, bytes: Number((await pool.query<{ b: string }>("SELECT pg_total_relation_size('queue_items') AS b")).rows[0]!.b) });
    }
    // 16 000 items went through, at most 1000 rows at a time in the table. Once the
    // retention caught up (a few rounds, while the B-trees split into their working size)
    // the table (heap, TOAST and every index) stops growing: the second half of the run
    // leaves it at most 40 % above the largest it was in the first half, where keeping the
    // rows would have doubled it. (B-tree pages emptied by VACUUM are reused a round or two
    // later, and a loaded machine's slow rounds keep more rows inside the retention: up to
    // ~20 % of slack was seen.)
    const bytes = sizes.map((s) => s.bytes);
    const firstHalf = Math.max(...bytes.slice(0, rounds / 2));
    expect(Math.max(...bytes.slice(rounds / 2)), JSON.stringify(sizes)).to.be.at.most(firstHalf * 1.4);
  });
});
