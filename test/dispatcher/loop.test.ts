// The dispatcher loop against a real Postgres. The exec backend here is the in-test
// TestBackend (local child processes, or scripted behaviour) — see support.ts.
import { createHash } from "node:crypto";
import { createServer, type Server } from "node:http";
import { expect } from "chai";
import { Code, SlotbrokerError } from "../../src/shared/errors.js";
import type pg from "pg";
import {
  ManualCapacitySource,
  migrate,
  QueueStore,
  type Dispatcher,
  type DispatcherConfig,
  type ExecInstance,
} from "../../src/dispatcher/index.js";
import { releaseItem } from "../../src/dispatcher/queue/sql.js";
import { createTestDatabase } from "../support/postgres.js";
import { release, track } from "../../harness/resources.js";
import { EventMonitor } from "../support/event-monitor.js";
import { closeAll, Gate, itemReaches, morePasses, openPool, receiptFor, runLocally, startDispatcher, TestBackend } from "./support.js";

const fast: Partial<DispatcherConfig> = { pollIntervalMs: 50, heartbeatIntervalMs: 100, staleAfterMs: 1000, retryInitialMs: 20, retryMaxMs: 100 };
const one: ExecInstance = { instanceId: "exec-1", address: "127.0.0.1:7600", capacity: 4, clients: 1 };
const sha256 = (b: Buffer | string): string => createHash("sha256").update(b).digest("hex");

describe("dispatcher loop", () => {
  let url: string;
  let pool: pg.Pool;
  let queue: QueueStore;
  before(async () => {
    url = await createTestDatabase("loop");
    await migrate(url);
  });
  beforeEach(async () => {
    pool = openPool(url);
    queue = new QueueStore(pool);
    await pool.query("TRUNCATE queue_items, fylrs CASCADE");
  });
  afterEach(async () => {
    await closeAll(pool);
  });

  const until = itemReaches;
  const passes = (d: Dispatcher, n: number): Promise<void> => morePasses([d], n);

  it("runs a local checksum item end to end", async () => {
    const d = await startDispatcher({ pool, capacity: new ManualCapacitySource(), backend: new TestBackend(), config: fast });
    const input = Buffer.from("the quick brown fox\n");
    // The database may say succeeded before the write's continuation counted it.
    const counted = new EventMonitor(d.events, "item:succeeded");
    const { item, created } = await d.submit({ local: { name: "checksum", params: { algorithm: "sha256" }, input } });
    expect(created).to.equal(true);
    const done = await until(d, item.id, ["succeeded", "failed"]);
    expect(done).to.deep.include({ state: "succeeded", attempts: 1, kind: "local" });
    expect(done.output!.toString()).to.equal(`${sha256(input)}\n`);
    await counted.awaitCount(1);
    expect(d.stats().counters).to.include({ claimed: 1, succeeded: 1 });
    await d.submit({ local: { name: "nope", params: {}, input } }).then(
      () => expect.fail("unknown action accepted"),
      (err: Error) => expect(err.message).to.match(/unknown local action "nope"/),
    );
    await release(d);
  });

  it("runs exec calls in order, feeding stdin inline, by URL and from the previous call", async () => {
    const body = Buffer.from("served over http\n");
    const server: Server = track(
      createServer((_req, res) => res.end(body)),
      "stdin http server",
      (s) => new Promise<void>((r) => s.close(() => r())),
    );
    await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
    const port = (server.address() as { port: number }).port;
    const backend = new TestBackend();
    const d = await startDispatcher({ pool, capacity: new ManualCapacitySource([one]), backend, config: fast });
    const { item } = await d.submit({
      calls: [
        { service: "cat", args: [], env: {}, stdin: { kind: "url", url: `http://127.0.0.1:${port}/in` } },
        { service: "sha256sum", args: [], env: {}, stdin: { kind: "previous" } },
      ],
    });
    const inline = (await d.submit({ calls: [{ service: "wc", args: ["-c"], env: {}, stdin: { kind: "data", data: Buffer.from("12345") } }] })).item;
    const done = await until(d, item.id, ["succeeded", "failed"]);
    expect(done.state, done.error).to.equal("succeeded");
    expect(done.output!.toString()).to.equal(`${sha256(body)}  -\n`);
    expect(done.results.map((r) => [r.service, r.receipt.exitCode])).to.deep.equal([["cat", 0], ["sha256sum", 0]]);
    expect(backend.requests.find((r) => r.service === "sha256sum")!.stdin).to.deep.equal(body);
    expect((await until(d, inline.id, ["succeeded"])).output!.toString().trim()).to.equal("5");
    await release(d);
    await release(server);
  });

  it("claims nothing exec-bound while no execserver is connected", async () => {
    const capacity = new ManualCapacitySource();
    const backend = new TestBackend();
    const d = await startDispatcher({ pool, capacity, backend, config: fast });
    const exec = (await d.submit({ calls: [{ service: "cat", args: [], env: {}, stdin: { kind: "data", data: Buffer.from("x") } }] })).item;
    const local = (await d.submit({ local: { name: "count", params: {}, input: Buffer.from("a b\n") } })).item;
    await until(d, local.id, ["succeeded"]);
    await passes(d, 5);
    expect(await d.get(exec.id)).to.deep.include({ state: "queued", attempts: 0, lease: 0 });
    expect(backend.requests).to.have.length(0);
    expect(d.stats()).to.include({ execAdmission: 0, execHeld: 0 });
    capacity.set([one]);
    expect((await until(d, exec.id, ["succeeded"])).output!.toString()).to.equal("x");
    expect(d.stats().shares).to.deep.equal([{ ...one, share: 4 + 2 }]);
    await release(d);
  });

  it("requeues an item whose slot never came a minute out, with its attempt given back", async () => {
    const backend = new TestBackend((request) => Promise.reject(new SlotbrokerError(Code.ResourceExhausted, `no slot for ${request.service}`)));
    const d = await startDispatcher({ pool, capacity: new ManualCapacitySource([one]), backend, config: fast });
    const requeued = new EventMonitor(d.events, "item:requeued");
    const { item } = await d.submit({ calls: [{ service: "cat", args: [], env: {} }] });
    const [, reason] = await requeued.awaitNext({ filter: (i) => i.id === item.id });
    expect(reason).to.equal("no-slot");
    expect(await d.get(item.id)).to.include({ state: "queued", lease: 1, attempts: 0 });
    const delay = await pool.query<{ s: string }>("SELECT extract(epoch FROM start_after - updated_at) AS s FROM queue_items WHERE id = $1", [item.id]);
    expect(Number(delay.rows[0]!.s)).to.equal(60);
    await passes(d, 5);
    expect(await d.get(item.id)).to.deep.include({ state: "queued", lease: 1 });
    expect(backend.requests).to.have.length(1);
    expect(d.stats().counters).to.include({ requeued: 1, failed: 0 });
    await release(d);
  });

  it("retries a failing command with backoff, then fails the item with its receipt", async () => {
    const d = await startDispatcher({ pool, capacity: new ManualCapacitySource([one]), backend: new TestBackend(), config: fast });
    const { item } = await d.submit({ calls: [{ service: "sh", args: ["echo oops >&2; exit 3"], env: {} }], maxAttempts: 3 });
    const failed = await until(d, item.id, ["failed", "succeeded"]);
    expect(failed).to.deep.include({ state: "failed", attempts: 3, lease: 3 });
    expect(failed.error).to.equal("calls[0] (sh): exited with code 3: oops");
    expect(failed.results[0]!.receipt.exitCode).to.equal(3);
    expect(d.stats().counters).to.include({ claimed: 3, requeued: 2, failed: 1 });
    await release(d);
  });

  it("fails an item whose stdout is over the limit at once, saying so", async () => {
    const d = await startDispatcher({ pool, capacity: new ManualCapacitySource([one]), backend: new TestBackend(), config: fast, store: { maxItemBytes: 10 } });
    const { item } = await d.submit({ calls: [{ service: "cat", args: [], env: {}, stdin: { kind: "data", data: Buffer.alloc(100, 65) } }] });
    const failed = await until(d, item.id, ["failed", "succeeded"]);
    expect(failed).to.deep.include({ state: "failed", attempts: 1 });
    expect(failed.error).to.equal("calls[0] (cat): stdout: more than 10 bytes, over the limit per item (store.maxItemBytes)");
    await release(d);
  });

  it("on stop, gives items still running after the grace period back to the queue and leaves", async () => {
    const gate = new Gate();
    const backend = new TestBackend(async (request, options) => {
      options.onStart?.("exec-1");
      await gate.wait(options.signal);
      return { receipt: receiptFor({ exitCode: 0 }), stdout: Buffer.alloc(0) };
    });
    const d = await startDispatcher({ pool, capacity: new ManualCapacitySource([one]), backend, config: fast });
    const a = (await d.submit({ calls: [{ service: "cat", args: [], env: {} }] })).item;
    const b = (await d.submit({ calls: [{ service: "cat", args: [], env: {} }] })).item;
    await until(d, a.id, ["running"]);
    await until(d, b.id, ["running"]);
    expect(d.liveItem(a.id)).to.include({ phase: "running", instanceId: "exec-1" });
    await d.stop({ graceMs: 50 });
    expect(d.state).to.equal("stopped");
    for (const id of [a.id, b.id]) expect(await queue.get(id)).to.deep.include({ state: "queued", attempts: 0, claimedBy: undefined });
    expect((await queue.listFylrs()).map((f) => f.id)).to.not.include(d.fylrId);
    expect(d.stats().counters).to.include({ requeued: 2 });
    await d.stop(); // idempotent
    await release(d);
  });

  it("on stop, lets items finish within the grace period", async () => {
    const gate = new Gate();
    const backend = new TestBackend(async (request, options) => {
      options.onStart?.("exec-1");
      await gate.wait(options.signal);
      return runLocally(request, options);
    });
    const d = await startDispatcher({ pool, capacity: new ManualCapacitySource([one]), backend, config: fast });
    const { item } = await d.submit({ calls: [{ service: "cat", args: [], env: {}, stdin: { kind: "data", data: Buffer.from("late") } }] });
    await until(d, item.id, ["running"]);
    const stopping = d.stop({ graceMs: 20_000 });
    expect(d.state).to.equal("stopping");
    gate.open();
    await stopping;
    expect(await queue.get(item.id)).to.deep.include({ state: "succeeded", output: Buffer.from("late") });
    await release(d);
  });

  it("drops a completion the lease fence refuses and counts the incident", async () => {
    const gate = new Gate();
    const backend = new TestBackend(async (request, options) => {
      options.onStart?.("exec-1");
      await gate.wait(options.signal);
      return { receipt: receiptFor({ exitCode: 0, stdout: Buffer.from("mine") }), stdout: Buffer.from("mine") };
    });
    const d = await startDispatcher({ pool, capacity: new ManualCapacitySource([one]), backend, config: fast });
    const { item } = await d.submit({ calls: [{ service: "cat", args: [], env: {} }] });
    await until(d, item.id, ["running"]);
    // A sibling took the item over (as after a requeue and a new claim): newer lease, new owner.
    await queue.registerFylr({ id: "sibling", hostname: "h", pid: 9 });
    await pool.query("UPDATE queue_items SET claimed_by = 'sibling', lease = lease + 1, state = 'claimed' WHERE id = $1", [item.id]);
    const fenced = new EventMonitor(d.events, "item:fenced");
    gate.open();
    await fenced.awaitNext({ filter: (i) => i.id === item.id });
    expect(d.stats().counters.fenced).to.equal(1);
    expect(await queue.get(item.id)).to.deep.include({ state: "claimed", claimedBy: "sibling", lease: 2, output: undefined });
    expect(d.stats().counters.succeeded).to.equal(0);
    await release(d);
  });

  it("abandons its items and re-registers when a sibling declared it dead, then runs them again under a new lease", async () => {
    const gate = new Gate();
    let aborted = 0;
    let onAborted: () => void = () => undefined;
    const firstRunAborted = new Promise<void>((resolve) => (onAborted = resolve));
    const backend = new TestBackend(async (request, options) => {
      options.onStart?.("exec-1");
      try {
        await gate.wait(options.signal);
      } catch (err) {
        aborted += 1;
        onAborted();
        throw err;
      }
      return { receipt: receiptFor({ exitCode: 0, stdout: Buffer.from("ok") }), stdout: Buffer.from("ok") };
    });
    // Only the sibling below declares this fylr dead: with the short staleAfter of `fast`, a
    // loaded machine let this fylr's own sweeps and claim audits abandon the run first.
    const d = await startDispatcher({ pool, capacity: new ManualCapacitySource([one]), backend, config: { ...fast, staleAfterMs: 60_000 } });
    const { item } = await d.submit({ calls: [{ service: "cat", args: [], env: {} }] });
    const started = new EventMonitor(d.events, "item:started");
    await until(d, item.id, ["running"]);
    // What a sibling does after this fylr's heartbeat stalled past the threshold. The stall
    // and the sweep share one transaction (a one-connection pool): a heartbeat of this fylr
    // that lands in between waits on the row lock and then finds its row gone, as after a
    // real stall, instead of freshening the row before the sweep (under load it did).
    await queue.registerFylr({ id: "sibling", hostname: "h", pid: 9 });
    const siblingPool = openPool(url, 1);
    await siblingPool.query("BEGIN");
    await siblingPool.query("UPDATE fylrs SET heartbeat_at = now() - interval '1 hour' WHERE id = $1", [d.fylrId]);
    const reaped = await new QueueStore(siblingPool).reapStale(1000, "sibling");
    await siblingPool.query("COMMIT");
    await closeAll(siblingPool);
    expect(reaped.requeued.map((r) => r.id)).to.deep.equal([item.id]);
    await firstRunAborted;
    expect(aborted).to.equal(1);
    const [again] = await started.awaitNext({ filter: (i) => i.id === item.id && i.lease === 2 });
    expect(again.claimedBy).to.equal(d.fylrId);
    expect((await queue.listFylrs()).map((f) => f.id)).to.include(d.fylrId);
    gate.open();
    expect(await until(d, item.id, ["succeeded"])).to.deep.include({ lease: 2, attempts: 2 });
    expect(d.stats().counters.fenced).to.equal(0);
    await release(d);
  });

  it("several loops on one queue run every item exactly once", async () => {
    const pools = [0, 1, 2, 3].map(() => openPool(url, 4));
    const backend = new TestBackend(async (_request, options) => {
      options.onStart?.("exec-1");
      await new Promise((r) => setImmediate(r));
      return { receipt: receiptFor({ exitCode: 0 }), stdout: Buffer.alloc(0) };
    });
    const loops: Dispatcher[] = [];
    for (const p of pools) {
      loops.push(await startDispatcher({ pool: p, capacity: new ManualCapacitySource([{ ...one, capacity: 8, clients: 4 }]), backend, config: { ...fast, localSlots: 3 } }));
    }
    let succeeded = 0;
    let onAllSucceeded: () => void = () => undefined;
    const allSucceeded = new Promise<void>((resolve) => (onAllSucceeded = resolve));
    for (const l of loops) {
      l.events.on("item:succeeded", () => {
        if (++succeeded === 300) onAllSucceeded();
      });
    }
    const ids: string[] = [];
    for (let i = 0; i < 150; i++) {
      ids.push((await loops[i % 4]!.submit({ local: { name: "count", params: {}, input: Buffer.from(`${i}`) } })).item.id);
      ids.push((await loops[i % 4]!.submit({ calls: [{ service: "cat", args: [], env: {} }], priority: i % 3 })).item.id);
    }
    await allSucceeded;
    const leases = await pool.query<{ lease: string; attempts: number; n: number }>("SELECT lease, attempts, count(*)::int AS n FROM queue_items GROUP BY 1, 2");
    expect(leases.rows).to.deep.equal([{ lease: "1", attempts: 1, n: ids.length }]);
    const claimed = loops.map((l) => l.stats().counters.claimed);
    expect(claimed.reduce((a, b) => a + b, 0)).to.equal(ids.length);
    for (const l of loops) await release(l);
    await closeAll(...pools);
  });

  it("under a backlog each success claims the next item in its own statement, never past admission", async () => {
    // Queued before the loop starts: a backlog from the first pass on.
    const n = { kind: "exec" as const, priority: 0, payload: { calls: [{ service: "cat", args: [], env: {} }] }, startAfter: undefined, maxAttempts: 3, idempotencyKey: undefined };
    for (let i = 0; i < 12; i++) await queue.submit(n);
    const statements = recordStatements(pool);
    let running = 0;
    let most = 0;
    const backend = new TestBackend(async (_request, options) => {
      most = Math.max(most, ++running);
      options.onStart?.("exec-1");
      await new Promise((r) => setTimeout(r, 5));
      running--;
      return { receipt: receiptFor({ exitCode: 0 }), stdout: Buffer.alloc(0) };
    });
    // Admission: ceil(1 / 1) + headroom 1 = 2.
    const d = await startDispatcher({ pool, capacity: new ManualCapacitySource([{ ...one, capacity: 1 }]), backend, config: { ...fast, pollIntervalMs: 60_000, headroom: 1 } });
    let held = 0;
    d.events.on("item:claimed", () => void (held = Math.max(held, d.stats().execHeld)));
    const done = new EventMonitor(d.events, "item:succeeded");
    await done.awaitCount(12);
    expect(held, "exec items held at any claim").to.be.at.most(2);
    expect(most).to.be.at.most(2);
    const claims = statements.filter((s) => s === "WITH next AS").length;
    const carried = statements.filter((s) => s === "WITH done AS").length;
    expect(carried, "successes that claimed").to.be.at.least(5);
    expect(claims, "claim statements of their own").to.be.at.most(3);
    const rows = await pool.query<{ state: string; lease: string; n: number }>("SELECT state, lease, count(*)::int AS n FROM queue_items GROUP BY 1, 2");
    expect(rows.rows).to.deep.equal([{ state: "succeeded", lease: "1", n: 12 }]);
    await release(d);
  });

  it("under a local backlog successes claim the next local items in their own statement, never past the permits", async () => {
    const n = { kind: "local" as const, priority: 0, payload: { local: { name: "count", params: {}, input: "" } }, startAfter: undefined, maxAttempts: 3, idempotencyKey: undefined };
    for (let i = 0; i < 30; i++) await queue.submit(n);
    const statements = recordStatements(pool);
    // Four permits, three of them open to normal items.
    const d = await startDispatcher({ pool, capacity: new ManualCapacitySource(), backend: new TestBackend(), config: { ...fast, pollIntervalMs: 60_000, localSlots: 4 } });
    let held = 0;
    d.events.on("item:claimed", () => void (held = Math.max(held, d.stats().localRunning)));
    const done = new EventMonitor(d.events, "item:succeeded");
    await done.awaitCount(30);
    expect(held, "local permits held at any claim").to.be.at.most(3);
    const claims = statements.filter((s) => s === "WITH candidates AS").length;
    const carried = statements.filter((s) => s === "WITH done AS").length;
    expect(carried, "successes that claimed").to.be.at.least(5);
    expect(claims, "claim statements of their own").to.be.at.most(4);
    const rows = await pool.query<{ state: string; lease: string; n: number }>("SELECT state, lease, count(*)::int AS n FROM queue_items GROUP BY 1, 2");
    expect(rows.rows).to.deep.equal([{ state: "succeeded", lease: "1", n: 30 }]);
    await release(d);
  });

  it("gives back an item a success claimed along once the fylr began to stop", async () => {
    const n = { kind: "exec" as const, priority: 0, payload: { calls: [{ service: "cat", args: [], env: {} }] }, startAfter: undefined, maxAttempts: 3, idempotencyKey: undefined };
    for (let i = 0; i < 3; i++) await queue.submit(n);
    // The first success that claims along waits here until the stop began.
    const gate = new Gate();
    let held: () => void = () => undefined;
    const reached = new Promise<void>((resolve) => (held = resolve));
    const query = pool.query.bind(pool) as (...args: unknown[]) => Promise<unknown>;
    (pool as unknown as { query: (...args: unknown[]) => unknown }).query = async (...args: unknown[]) => {
      const first = args[0] as string | { text: string };
      const text = typeof first === "string" ? first : first.text;
      if (text.trim().startsWith("WITH done AS")) {
        held();
        await gate.wait(new AbortController().signal);
      }
      // A give-back slower than the rest of the stop: the stop still waits for it.
      if (text === releaseItem) await new Promise((r) => setTimeout(r, 300));
      return query(...args);
    };
    const backend = new TestBackend((_request, options) => {
      options.onStart?.("exec-1");
      return Promise.resolve({ receipt: receiptFor({ exitCode: 0 }), stdout: Buffer.alloc(0) });
    });
    // Admission 1: one item at a time.
    const d = await startDispatcher({ pool, capacity: new ManualCapacitySource([{ ...one, capacity: 1 }]), backend, config: { ...fast, pollIntervalMs: 60_000, headroom: 0 } });
    await reached;
    const stopped = d.stop({ graceMs: 5_000 });
    gate.open();
    await stopped;
    expect(backend.requests).to.have.length(1);
    const rows = await pool.query<{ state: string; attempts: number; n: number }>("SELECT state, attempts, count(*)::int AS n FROM queue_items GROUP BY 1, 2 ORDER BY 1");
    expect(rows.rows).to.deep.equal([
      { state: "queued", attempts: 0, n: 2 },
      { state: "succeeded", attempts: 1, n: 1 },
    ]);
    await release(d);
  });
});

/** Records the first three words of every statement sent through `pool` from now on. */
function recordStatements(pool: pg.Pool): string[] {
  const statements: string[] = [];
  const query = pool.query.bind(pool) as (...args: unknown[]) => unknown;
  (pool as unknown as { query: (...args: unknown[]) => unknown }).query = (...args: unknown[]) => {
    const first = args[0] as string | { text: string };
    statements.push((typeof first === "string" ? first : first.text).trim().split(/\s+/).slice(0, 3).join(" "));
    return query(...args);
  };
  return statements;
}
