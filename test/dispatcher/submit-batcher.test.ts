// Group insert of queued submits (SubmitBatcher): a lone submit goes at once with the
// single-row statement; submits arriving while two inserts are on their way go together in
// one statement, in arrival order; idempotency keys and failures end as they did one by one.
// Real Postgres.
import { expect } from "chai";
import type pg from "pg";
import {
  createDefaultActions,
  Dispatcher,
  ManualCapacitySource,
  migrate,
  normalizeSubmit,
  QueueStore,
  type NormalizedSubmit,
  type SubmitInput,
} from "../../src/dispatcher/index.js";
import { SubmitBatcher } from "../../src/dispatcher/queue/group-commit.js";
import { Code } from "../../src/shared/errors.js";
import { EventMonitor } from "../support/event-monitor.js";
import { createTestDatabase } from "../support/postgres.js";
import { release, track } from "../../harness/resources.js";
import { closeAll, Gate, itemReaches, openPool, runLocally, TestBackend } from "./support.js";

const limits = { maxInputBytes: 1 << 20, defaultMaxAttempts: 3 };
const cat = (text: string, extra: Partial<SubmitInput> = {}): NormalizedSubmit =>
  normalizeSubmit({ calls: [{ service: "cat", args: [], env: {}, stdin: { kind: "data", data: Buffer.from(text) } }], ...extra }, createDefaultActions(), limits);

describe("group insert of queued submits", function () {
  this.timeout(30_000);
  let url: string;
  let pool: pg.Pool;
  let queue: QueueStore;
  let statements: string[];
  /** The group statements fail as if their connection broke (no answer: they may have committed). */
  let breakGroups: boolean;

  before(async () => {
    url = await createTestDatabase("submit_batcher");
    await migrate(url);
  });

  beforeEach(async () => {
    pool = openPool(url);
    queue = new QueueStore(pool);
    await pool.query("TRUNCATE queue_items, fylrs CASCADE");
    statements = [];
    const one = queue.submit.bind(queue);
    queue.submit = (...args) => (statements.push("one"), one(...args));
    const query = pool.query.bind(pool) as (...args: unknown[]) => Promise<unknown>;
    breakGroups = false;
    (pool as { query: unknown }).query = (...args: unknown[]) => {
      const config = args[0] as { text?: string; values?: unknown[][] };
      if (config.text?.includes("WITH ORDINALITY")) {
        statements.push(`many ${config.values![0]!.length}`);
        if (breakGroups) return Promise.reject(new Error("Connection terminated unexpectedly"));
      }
      return query(...args);
    };
  });

  afterEach(() => closeAll(pool));

  const seqOf = async (ids: string[]): Promise<number[]> => {
    const rows = (await pool.query<{ id: string; seq: string }>("SELECT id, seq FROM queue_items WHERE id = ANY($1::uuid[])", [ids])).rows;
    return ids.map((id) => Number(rows.find((r) => r.id === id)!.seq));
  };

  it("sends a lone submit at once with the single-row statement", async () => {
    const batcher = new SubmitBatcher(queue);
    const pending = batcher.submit(cat("alone"));
    expect(statements, "sent before the caller went on").to.deep.equal(["one"]);
    const { item, created } = await pending;
    expect(created).to.equal(true);
    expect(item).to.deep.include({ state: "queued", attempts: 0, lease: 0 });
    expect(item.calls[0]!.stdin).to.deep.equal({ kind: "data", data: Buffer.from("alone") });
  });

  it("groups the submits that arrive while two inserts are on their way, in arrival order", async () => {
    const batcher = new SubmitBatcher(queue);
    const results = await Promise.all(Array.from({ length: 7 }, (_, i) => batcher.submit(cat(`${i}`, { priority: i % 2 }))));
    expect(statements).to.deep.equal(["one", "one", "many 5"]);
    expect(results.every((r) => r.created && r.item.state === "queued")).to.equal(true);
    expect(results.map((r) => r.item.calls[0]!.stdin)).to.deep.equal(results.map((_, i) => ({ kind: "data", data: Buffer.from(`${i}`) })));
    expect(results.map((r) => r.item.priority)).to.deep.equal([0, 1, 0, 1, 0, 1, 0]);
    const seqs = (await seqOf(results.map((r) => r.item.id))).slice(2); // the group's
    expect([...seqs].sort((a, b) => a - b)).to.deep.equal(seqs);
    expect(new Set(results.map((r) => r.item.id)).size).to.equal(7);
  });

  it("answers each grouped submit with its item exactly as the database then reads it", async () => {
    const batcher = new SubmitBatcher(queue);
    const submits = [
      cat("a"),
      cat("b"),
      cat("c", { priority: 4, idempotencyKey: "g-1", fairnessKey: "k", fairnessWeight: 2, fairnessLimit: 5 }),
      cat("d", { maxAttempts: 9, traceparent: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", startAfter: new Date(Date.now() + 60_000) }),
      cat("e"),
    ];
    const answers = await Promise.all(submits.map((n) => batcher.submit(n)));
    expect(statements).to.deep.equal(["one", "one", "many 3"]);
    for (const { item, created } of answers) {
      expect(created).to.equal(true);
      expect(item).to.deep.equal(await queue.get(item.id));
    }
  });

  it("gives an entry whose key is taken (before, or earlier in its group) the key's holder, created once", async () => {
    const batcher = new SubmitBatcher(queue);
    const held = await batcher.submit(cat("first", { idempotencyKey: "held" }));
    await new Promise((r) => setImmediate(r)); // its insert is over
    statements.length = 0;
    const results = await Promise.all([
      batcher.submit(cat("a")),
      batcher.submit(cat("b")),
      batcher.submit(cat("again", { idempotencyKey: "held" })),
      batcher.submit(cat("twin 1", { idempotencyKey: "twin" })),
      batcher.submit(cat("twin 2", { idempotencyKey: "twin" })),
    ]);
    // Two alone, three in a group, then the two whose keys were taken each on its own.
    expect(statements).to.deep.equal(["one", "one", "many 3", "one", "one"]);
    expect(results.map((r) => r.created)).to.deep.equal([true, true, false, true, false]);
    expect(results[2].item.id).to.equal(held.item.id);
    expect(results[4].item.id).to.equal(results[3].item.id);
    expect(results[4].item.calls[0]!.stdin).to.deep.equal({ kind: "data", data: Buffer.from("twin 1") });
    expect((await pool.query("SELECT 1 FROM queue_items")).rowCount, "held, a, b, twin").to.equal(4);
  });

  it("sends every entry of a failed group statement again on its own: only the bad one fails", async () => {
    const batcher = new SubmitBatcher(queue);
    const bad: NormalizedSubmit = { ...cat("bad"), maxAttempts: 0 }; // the table's CHECK refuses it
    const leads = [batcher.submit(cat("lead 1")), batcher.submit(cat("lead 2"))];
    const results = await Promise.allSettled([...leads, batcher.submit(cat("ok 1")), batcher.submit(bad), batcher.submit(cat("ok 2"))]);
    expect(results.map((r) => r.status)).to.deep.equal(["fulfilled", "fulfilled", "fulfilled", "rejected", "fulfilled"]);
    expect(statements).to.deep.equal(["one", "one", "many 3", "one", "one", "one"]);
    expect((await pool.query("SELECT 1 FROM queue_items")).rowCount).to.equal(4);
  });

  it("fails every entry of a group statement whose answer never came (it may have committed): none is sent again", async () => {
    const batcher = new SubmitBatcher(queue);
    breakGroups = true;
    const leads = [batcher.submit(cat("lead 1")), batcher.submit(cat("lead 2"))];
    const results = await Promise.allSettled([...leads, batcher.submit(cat("lost 1")), batcher.submit(cat("lost 2"))]);
    expect(results.map((r) => r.status)).to.deep.equal(["fulfilled", "fulfilled", "rejected", "rejected"]);
    expect((results[2] as PromiseRejectedResult).reason).to.deep.include({ code: Code.Unavailable });
    expect(statements).to.deep.equal(["one", "one", "many 2"]);
    expect((await pool.query("SELECT 1 FROM queue_items")).rowCount).to.equal(2);
  });

  it("a fylr's queued submits under load: grouped, and every item runs once", async () => {
    const gate = new Gate();
    const backend = new TestBackend(async (request, options) => {
      options.onStart?.("test-instance");
      await gate.wait(options.signal);
      return runLocally(request, { ...options, onStart: undefined });
    });
    const capacity = new ManualCapacitySource([{ instanceId: "exec-1", address: "127.0.0.1:7600", capacity: 2, clients: 1 }]);
    const d = new Dispatcher({ pool, capacity, backend, migrate: false, config: { pollIntervalMs: 60_000, heartbeatIntervalMs: 100, staleAfterMs: 1000, headroom: 0 } });
    track(d, `dispatcher ${d.fylrId}`, (x) => x.stop({ graceMs: 0 }).catch(() => undefined));
    await d.start();
    const results = await Promise.all(Array.from({ length: 16 }, (_, i) => d.submit({ calls: [{ service: "cat", args: [], env: {}, stdin: { kind: "data", data: Buffer.from(`${i}`) } }] })));
    expect(statements.filter((s) => s.startsWith("many")).length, "group statements").to.be.at.least(1);
    const succeeded = new EventMonitor(d.events, "item:succeeded");
    gate.open();
    for (const [i, { item }] of results.entries()) {
      const done = await itemReaches(d, item.id, ["succeeded", "failed"]);
      expect(done).to.deep.include({ state: "succeeded", attempts: 1 });
      expect(done.output!.toString()).to.equal(`${i}`);
    }
    // The row is written before the fylr counts it: wait for its events, not the rows.
    await succeeded.awaitCount(16);
    expect(d.stats().counters).to.include({ claimed: 16, succeeded: 16 });
    await release(d);
  });
});
