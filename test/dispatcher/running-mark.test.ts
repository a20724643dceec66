// The claimed → running write of exec items put off by dispatcher.runningMarkDelay, against a
// real Postgres: a job done within the grace is never written running, a longer one is, and
// the lease fence, cancels and a dead fylr's sweep work the same whether the mark was
// written or not. Every state a row takes is logged by a row trigger of this test's database.
import { expect } from "chai";
import type pg from "pg";
import {
  createDefaultActions,
  ItemControlStore,
  ManualCapacitySource,
  migrate,
  normalizeSubmit,
  QueueStore,
  type Dispatcher,
  type DispatcherConfig,
  type ExecInstance,
  type ExecRunOptions,
} from "../../src/dispatcher/index.js";
import { ErrorKind } from "../../gen/slotbroker/v1/broker_pb.js";
import { createTestDatabase } from "../support/postgres.js";
import { release } from "../../harness/resources.js";
import { EventMonitor } from "../support/event-monitor.js";
import { closeAll, Gate, itemReaches, openPool, receiptFor, runLocally, startClaimer, startDispatcher, TestBackend } from "./support.js";

const fast: Partial<DispatcherConfig> = { pollIntervalMs: 50, heartbeatIntervalMs: 100, staleAfterMs: 1000 };
const one: ExecInstance = { instanceId: "exec-1", address: "127.0.0.1:7600", capacity: 4, clients: 1 };
const cat = (text: string) => ({ calls: [{ service: "cat", args: [], env: {}, stdin: { kind: "data" as const, data: Buffer.from(text) } }] });

describe("the running mark put off by dispatcher.runningMarkDelay", () => {
  let url: string;
  let pool: pg.Pool;
  let queue: QueueStore;
  before(async () => {
    url = await createTestDatabase("running_mark");
    await migrate(url);
    const setup = openPool(url, 1);
    await setup.query(`
      CREATE TABLE state_log (seq bigserial PRIMARY KEY, id uuid NOT NULL, state text NOT NULL);
      CREATE FUNCTION log_state() RETURNS trigger LANGUAGE plpgsql AS $$
      BEGIN INSERT INTO state_log (id, state) VALUES (NEW.id, NEW.state); RETURN NULL; END $$;
      CREATE TRIGGER log_state AFTER INSERT OR UPDATE OF state ON queue_items FOR EACH ROW EXECUTE FUNCTION log_state();`);
    await closeAll(setup);
  });
  beforeEach(async () => {
    pool = openPool(url);
    queue = new QueueStore(pool);
    await pool.query("TRUNCATE queue_items, fylrs, state_log CASCADE");
  });
  afterEach(async () => {
    await closeAll(pool);
  });

  // Every state item `id` was written in, in order (one row per write, repeats included).
  const history = async (id: string): Promise<string[]> =>
    (await pool.query<{ state: string }>("SELECT state FROM state_log WHERE id = $1 ORDER BY seq", [id])).rows.map((r) => r.state);

  // This fylr's live view from now on (make it before the submit): when item `id`'s job
  // started (phase running), and when the fylr let the item go (its task ended).
  const liveView = (d: Dispatcher) => {
    const starts = new EventMonitor(d.events, "item:changed");
    const ends = new EventMonitor(d.events, "item:changed");
    return {
      jobStarted: (id: string) => starts.awaitNext({ filter: (live, removed) => live.id === id && !removed && live.phase === "running" }),
      letGo: (id: string) => ends.awaitNext({ filter: (live, removed) => live.id === id && removed }),
    };
  };

  // A job that waits for `gate` and then succeeds with stdout "ok"; stopped, it ends as an
  // execserver's job does (a receipt saying CANCEL_REQUESTED). `ignoreAbort` lets it finish
  // well although its run was stopped (its DONE was already on its way).
  const gated = (gate: Gate, aborts: unknown[], ignoreAbort = false) =>
    new TestBackend(async (_request, options: ExecRunOptions) => {
      options.onStart?.("exec-1");
      options.signal.addEventListener("abort", () => aborts.push(options.signal.reason), { once: true });
      try {
        await gate.wait(ignoreAbort ? new AbortController().signal : options.signal);
      } catch {
        return { receipt: receiptFor({ error: ErrorKind.CANCEL_REQUESTED, signal: "SIGTERM" }), stdout: Buffer.alloc(0) };
      }
      return { receipt: receiptFor({ exitCode: 0, stdout: Buffer.from("ok") }), stdout: Buffer.from("ok") };
    });

  it("a job done within the grace goes from claimed straight to succeeded: no running write, no item:started", async () => {
    const d = await startDispatcher({ pool, capacity: new ManualCapacitySource([one]), backend: new TestBackend(), config: { ...fast, runningMarkDelayMs: 5_000 } });
    const started = new EventMonitor(d.events, "item:started");
    const view = liveView(d);
    const { item } = await d.submit(cat("quick"));
    const running = view.jobStarted(item.id);
    const done = await itemReaches(d, item.id, ["succeeded", "failed"]);
    await running;
    expect(done).to.deep.include({ state: "succeeded", attempts: 1, output: Buffer.from("quick") });
    expect(await history(item.id)).to.deep.equal(["queued", "claimed", "succeeded"]);
    expect(started.count).to.equal(0);
    expect(d.stats().counters).to.include({ succeeded: 1, fenced: 0 });
    await release(d);
  });

  it("a chain whose calls are all done within the grace: each call's start counts once, no running write", async () => {
    const d = await startDispatcher({ pool, capacity: new ManualCapacitySource([one]), backend: new TestBackend(), config: { ...fast, runningMarkDelayMs: 5_000 } });
    const { item } = await d.submit({
      calls: [
        { service: "cat", args: [], env: {}, stdin: { kind: "data", data: Buffer.from("chain") } },
        { service: "wc", args: ["-c"], env: {}, stdin: { kind: "previous" } },
      ],
    });
    const done = await itemReaches(d, item.id, ["succeeded", "failed"]);
    expect(done.state).to.equal("succeeded");
    expect(done.output!.toString().trim()).to.equal("5");
    expect(await history(item.id)).to.deep.equal(["queued", "claimed", "succeeded"]);
    await release(d);
  });

  it("a job longer than the grace is written running once the grace has passed, then succeeds", async () => {
    const gate = new Gate();
    const d = await startDispatcher({ pool, capacity: new ManualCapacitySource([one]), backend: gated(gate, []), config: { ...fast, runningMarkDelayMs: 150 } });
    const view = liveView(d);
    const { item } = await d.submit(cat("x"));
    await view.jobStarted(item.id);
    const jobAt = performance.now();
    expect((await queue.get(item.id))?.state).to.equal("claimed");
    const [startedItem] = await new EventMonitor(d.events, "item:started").awaitNext({ filter: (i) => i.id === item.id });
    expect(performance.now() - jobAt).to.be.at.least(140);
    expect(startedItem.id).to.equal(item.id);
    expect((await queue.get(item.id))?.state).to.equal("running");
    gate.open();
    expect(await itemReaches(d, item.id, ["succeeded"])).to.deep.include({ state: "succeeded", output: Buffer.from("ok") });
    expect(await history(item.id)).to.deep.equal(["queued", "claimed", "running", "succeeded"]);
    await release(d);
  });

  it("with the delay 0 the mark is written as the job starts, as before", async () => {
    const d = await startDispatcher({ pool, capacity: new ManualCapacitySource([one]), backend: new TestBackend(), config: { ...fast, runningMarkDelayMs: 0 } });
    const started = new EventMonitor(d.events, "item:started");
    const { item } = await d.submit(cat("at once"));
    await itemReaches(d, item.id, ["succeeded"]);
    expect(await history(item.id)).to.deep.equal(["queued", "claimed", "running", "succeeded"]);
    expect(started.count).to.equal(1);
    await release(d);
  });

  it("a claim taken back during the grace: the job's completion is refused and counted as fenced, and the job ran once", async () => {
    const gate = new Gate();
    const backend = gated(gate, []);
    const d = await startDispatcher({ pool, capacity: new ManualCapacitySource([one]), backend, config: { ...fast, runningMarkDelayMs: 10_000 } });
    const view = liveView(d);
    const { item } = await d.submit(cat("x"));
    await view.jobStarted(item.id);
    // A sibling took the item over (as after a sweep and a new claim): newer lease, new owner.
    await queue.registerFylr({ id: "sibling", hostname: "h", pid: 9 });
    await pool.query("UPDATE queue_items SET claimed_by = 'sibling', lease = lease + 1 WHERE id = $1", [item.id]);
    const fenced = new EventMonitor(d.events, "item:fenced");
    gate.open();
    await fenced.awaitNext({ filter: (i) => i.id === item.id });
    expect(d.stats().counters).to.include({ fenced: 1, succeeded: 0, cancelled: 0 });
    expect(await queue.get(item.id)).to.deep.include({ state: "claimed", claimedBy: "sibling", lease: 2, output: undefined });
    expect(backend.requests).to.have.length(1);
    expect(await history(item.id)).to.not.include("running");
    await release(d);
  });

  it("a claim taken back during the grace of a long job: the mark at the grace's end is refused, the job stopped and counted as fenced", async () => {
    const gate = new Gate();
    const aborts: unknown[] = [];
    const backend = gated(gate, aborts);
    const d = await startDispatcher({ pool, capacity: new ManualCapacitySource([one]), backend, config: { ...fast, runningMarkDelayMs: 300 } });
    const fenced = new EventMonitor(d.events, "item:fenced");
    const view = liveView(d);
    const { item } = await d.submit(cat("x"));
    await view.jobStarted(item.id);
    await queue.registerFylr({ id: "sibling", hostname: "h", pid: 9 });
    await pool.query("UPDATE queue_items SET claimed_by = 'sibling', lease = lease + 1 WHERE id = $1", [item.id]);
    await fenced.awaitNext({ filter: (i) => i.id === item.id });
    await view.letGo(item.id);
    expect(aborts).to.have.length(1);
    expect(d.stats().counters).to.include({ fenced: 1, succeeded: 0, failed: 0, requeued: 0 });
    expect(await queue.get(item.id)).to.deep.include({ state: "claimed", claimedBy: "sibling", lease: 2, output: undefined });
    expect(backend.requests).to.have.length(1);
    await release(d);
  });

  it("a cancel during the grace (another fylr's Cancel: a notification) stops the job; the item ends cancelled, no incident", async () => {
    const gate = new Gate();
    const aborts: unknown[] = [];
    const d = await startDispatcher({ pool, capacity: new ManualCapacitySource([one]), backend: gated(gate, aborts), config: { ...fast, runningMarkDelayMs: 10_000 } });
    const view = liveView(d);
    const { item } = await d.submit(cat("x"));
    await view.jobStarted(item.id);
    const stopping = new EventMonitor(d.events, "item:cancel-requested").awaitNext({ filter: (i) => i === item.id });
    const cancel = await new ItemControlStore(pool).cancel(item.id);
    expect(cancel).to.deep.include({ previous: "claimed" });
    expect(cancel.item.state).to.equal("cancelled");
    await stopping;
    await view.letGo(item.id);
    expect(aborts.map((r) => (r as { kind?: string }).kind)).to.deep.equal(["cancel-requested"]);
    expect(d.stats().counters).to.include({ fenced: 0, succeeded: 0, cancelled: 1 });
    // The stopped job's receipt joins the item the Cancel ended; its end time stays the Cancel's.
    const final = (await queue.get(item.id))!;
    expect(final).to.deep.include({ state: "cancelled", error: "cancelled by request; cat was cancelled on request", finishedAt: cancel.item.finishedAt });
    expect(final.results.map((r) => r.receipt.error)).to.deep.equal([ErrorKind.CANCEL_REQUESTED]);
    expect(await history(item.id)).to.deep.equal(["queued", "claimed", "cancelled", "cancelled"]);
    await release(d);
  });

  it("a cancel that crosses a job's success during the grace: the cancel wins, counted as cancelled, not fenced", async () => {
    const gate = new Gate();
    const aborts: unknown[] = [];
    const d = await startDispatcher({ pool, capacity: new ManualCapacitySource([one]), backend: gated(gate, aborts, true), config: { ...fast, runningMarkDelayMs: 10_000 } });
    const view = liveView(d);
    const { item } = await d.submit(cat("x"));
    await view.jobStarted(item.id);
    const stopping = new EventMonitor(d.events, "item:cancel-requested").awaitNext({ filter: (i) => i === item.id });
    const cancelledEvent = new EventMonitor(d.events, "item:cancelled");
    await new ItemControlStore(pool).cancel(item.id);
    await stopping;
    gate.open(); // the job ends well all the same: its DONE was already on its way
    await cancelledEvent.awaitNext({ filter: (i) => i.id === item.id });
    await view.letGo(item.id);
    expect(aborts).to.have.length(1);
    expect(d.stats().counters).to.include({ fenced: 0, succeeded: 0 });
    // Cancelled whatever the receipt says; the receipt is kept.
    const final = (await queue.get(item.id))!;
    expect(final).to.deep.include({ state: "cancelled", output: undefined, error: "cancelled by request; cat exited with code 0" });
    expect(final.results).to.have.length(1);
    await release(d);
  });

  it("a fylr killed during the grace: its claimed (never running) item is requeued by a survivor and run once", async () => {
    const n = normalizeSubmit(cat("again"), createDefaultActions(), { maxInputBytes: 1024, defaultMaxAttempts: 3 });
    const id = (await queue.submit(n)).item.id;
    const victim = startClaimer(["hold", url, "1", "600000"]);
    const victimId = (await victim.awaitLine((l) => "fylrId" in l)).fylrId as string;
    await victim.awaitLine((l) => l.jobsStarted === 1);
    expect(await queue.get(id)).to.deep.include({ state: "claimed", claimedBy: victimId, lease: 1 });
    victim.child.kill("SIGKILL");
    await victim.exited;
    const backend = new TestBackend(runLocally);
    const survivor = await startDispatcher({ pool, capacity: new ManualCapacitySource([one]), backend, config: { ...fast, runningMarkDelayMs: 10_000 } });
    const done = await itemReaches(survivor, id, ["succeeded", "failed"]);
    expect(done).to.deep.include({ state: "succeeded", claimedBy: survivor.fylrId, lease: 2, attempts: 2, output: Buffer.from("again") });
    expect(backend.requests).to.have.length(1);
    expect(survivor.stats().counters).to.include({ orphansRescued: 1, succeeded: 1, fenced: 0 });
    expect(await history(id)).to.deep.equal(["queued", "claimed", "queued", "claimed", "succeeded"]);
    await release(survivor);
    await release(victim.child);
  });
});
