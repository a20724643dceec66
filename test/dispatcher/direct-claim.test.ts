// A submit claimed in its own INSERT: when the submitting fylr knows the exec queue drained
// and has a free exec place, the item is inserted already claimed by it and its task starts
// at once; otherwise it is queued as before. Real Postgres, real LISTEN/NOTIFY; the exec
// backend is the in-test one (support.ts). The dispatchers poll once a minute, so whatever
// happens within seconds was a submit, a notification or a finished item.
import { Readable } from "node:stream";
import { pipeline } from "node:stream/promises";
import { expect } from "chai";
import type pg from "pg";
import {
  createDefaultActions,
  Dispatcher,
  ManualCapacitySource,
  migrate,
  normalizeSubmit,
  QueueStore,
  type SubmitInput,
  type DispatcherConfig,
  type ExecBackend,
  type ExecInstance,
  type QueueItem,
} from "../../src/dispatcher/index.js";
import { createTestDatabase } from "../support/postgres.js";
import { release, track } from "../../harness/resources.js";
import { awaitCondition, EventMonitor } from "../support/event-monitor.js";
import { closeAll, Gate, itemReaches, openPool, runLocally, startClaimer, startDispatcher, TestBackend } from "./support.js";

const slowPoll: Partial<DispatcherConfig> = { pollIntervalMs: 60_000, heartbeatIntervalMs: 100, staleAfterMs: 1000, headroom: 0 };
const instance = (capacity: number): ExecInstance => ({ instanceId: "exec-1", address: "127.0.0.1:7600", capacity, clients: 1 });
const cat = (text = "x") => ({ service: "cat", args: [], env: {}, stdin: { kind: "data" as const, data: Buffer.from(text) } });

describe("a submit claimed in its own insert", function () {
  this.timeout(60_000);
  let url: string;
  let pool: pg.Pool;
  let queue: QueueStore;
  before(async () => {
    url = await createTestDatabase("direct_claim");
    await migrate(url);
  });
  beforeEach(async () => {
    pool = openPool(url);
    queue = new QueueStore(pool);
    await pool.query("TRUNCATE queue_items, fylrs, blobs CASCADE");
  });
  afterEach(() => closeAll(pool));

  /** A started dispatcher whose LISTEN is up and whose passes found the exec queue drained. */
  async function idle(capacity: number, backend: ExecBackend = new TestBackend(), config: Partial<DispatcherConfig> = {}): Promise<Dispatcher> {
    const d = new Dispatcher({ pool, capacity: new ManualCapacitySource([instance(capacity)]), backend, migrate: false, config: { ...slowPoll, ...config } });
    track(d, `dispatcher ${d.fylrId}`, (x) => x.stop({ graceMs: 0 }).catch(() => undefined));
    // Monitors first: the first pass and LISTEN's "up" may come before start() returns.
    const passes = new EventMonitor(d.events, "pass");
    const up = new EventMonitor(d.events, "notify:up");
    const beat = new EventMonitor(d.events, "heartbeat");
    await d.start();
    // The first pass, and the pass LISTEN's "up" asks for: the exec queue is known drained then.
    await up.awaitNext();
    await passes.awaitCount(2);
    await beat.awaitNext(); // its first heartbeat (on a connection of its own) is written too
    for (const m of [passes, up, beat]) m.release();
    return d;
  }

  /** Queues an item straight through the store, as another fylr's submit would. */
  const queueElsewhere = (input: SubmitInput): Promise<{ item: QueueItem }> =>
    queue.submit(normalizeSubmit(input, createDefaultActions(), { maxInputBytes: 1024, defaultMaxAttempts: 3 }));

  /** Counts the claim statements `d` sends. */
  function countClaims(d: Dispatcher): { readonly count: number } {
    const counter = { count: 0 };
    const claim = d.queue.claim.bind(d.queue);
    d.queue.claim = (...args) => {
      counter.count += 1;
      return claim(...args);
    };
    return counter;
  }

  /** A backend whose calls wait for `gate` (or their abort); counts the calls started. */
  function gated(gate: Gate): TestBackend {
    return new TestBackend(async (request, options) => {
      options.onStart?.("test-instance");
      await gate.wait(options.signal);
      return runLocally(request, { ...options, onStart: undefined });
    });
  }

  const stateOf = async (id: string): Promise<QueueItem> => (await queue.get(id))!;
  /** Waits (woken by the queue's notifications) until the item's row passes `check`. */
  const awaitRow = async (id: string, check: (item: QueueItem) => boolean): Promise<void> => {
    const listener = await pool.connect();
    try {
      await listener.query("LISTEN slotbroker_queue");
      await awaitCondition(`item ${id}`, [(wake) => (listener.on("notification", wake), () => listener.off("notification", wake))], async () => check(await stateOf(id)) || undefined, 10_000);
    } finally {
      await listener.query("UNLISTEN *");
      listener.release();
    }
  };

  it("claims a submit to an idle fylr in its insert: no claim statement, no 'queued' notification, and Watch's 'changed' still come", async () => {
    const d = await idle(4);
    const sibling = await idle(4);
    const claims = countClaims(d);
    const siblingClaims = countClaims(sibling);
    const listener = await pool.connect();
    const heard: string[] = [];
    listener.on("notification", (n) => heard.push(n.payload ?? ""));
    await listener.query("LISTEN slotbroker_queue");
    const claimed = new EventMonitor(d.events, "item:claimed");
    const siblingWoken = new EventMonitor(sibling.events, "wakeup");
    try {
      const { item, created } = await d.submit({ calls: [cat("direct")] });
      expect(created).to.equal(true);
      // Exactly what a claim writes.
      expect(item).to.deep.include({ state: "claimed", claimedBy: d.fylrId, lease: 1, attempts: 1 });
      expect(item.claimedAt).to.be.instanceOf(Date);
      expect((await claimed.awaitNext())[0].id).to.equal(item.id);
      const done = await itemReaches(d, item.id, ["succeeded", "failed"]);
      expect(done).to.deep.include({ state: "succeeded", claimedBy: d.fylrId, lease: 1, attempts: 1 });
      expect(done.output!.toString()).to.equal("direct");
      await listener.query("SELECT 1"); // the commits' notifications are in before this answer
      expect(claims.count, "claim statements of the submitting fylr").to.equal(0);
      expect(siblingClaims.count, "claim statements of the sibling").to.equal(0);
      expect(siblingWoken.all.map(([source]) => source), "the sibling's wakeups").to.not.include("notify");
      expect(heard, "notifications").to.not.include("queued");
      // → succeeded still tells every fylr's Watch streams (and claimed → running too, when
      // this job outlasted dispatcher.runningMarkDelay on a busy machine).
      expect(heard.filter((p) => p.startsWith("changed ") && p.includes(item.id)).length).to.be.at.least(1);
      expect(d.stats().counters).to.include({ claimed: 1, claimedDirectly: 1, succeeded: 1 });
    } finally {
      await listener.query("UNLISTEN *");
      listener.release();
    }
    await release(d);
    await release(sibling);
  });

  it("queues the submit when the fylr holds its whole share, and claims it once a place frees", async () => {
    const gate = new Gate();
    const d = await idle(1, gated(gate));
    const first = await d.submit({ calls: [cat("1")] });
    expect(first.item.state).to.equal("claimed");
    const claimed = new EventMonitor(d.events, "item:claimed");
    const second = await d.submit({ calls: [cat("2")] });
    expect(second.item).to.deep.include({ state: "queued", lease: 0, attempts: 0 });
    expect(second.item.claimedBy).to.equal(undefined);
    gate.open();
    expect((await claimed.awaitNext({ filter: (i) => i.id === second.item.id }))[0].lease).to.equal(1);
    for (const { item } of [first, second]) expect(await itemReaches(d, item.id, ["succeeded", "failed"])).to.deep.include({ state: "succeeded", attempts: 1 });
    expect(d.stats().counters).to.include({ claimed: 2, claimedDirectly: 1 });
    await release(d);
  });

  it("queues the submit while the fylr knows of a queued item (its claim is still on the way), then claims both in order", async () => {
    const d = await idle(4);
    // Hold the next claim statement: the hint stays open while it is on its way.
    const claimGate = new Gate();
    const claim = d.queue.claim.bind(d.queue);
    let claimsStarted = 0;
    const claimOn = new EventMonitor(d.events, "wakeup");
    d.queue.claim = async (...args) => {
      claimsStarted += 1;
      await claimGate.wait(AbortSignal.timeout(20_000));
      return claim(...args);
    };
    const older = await queueElsewhere({ calls: [cat("older")] });
    await claimOn.awaitNext({ filter: (source) => source === "notify" });
    const claimed = new EventMonitor(d.events, "item:claimed");
    const newer = await d.submit({ calls: [cat("newer")] });
    expect(newer.item.state, "a submit while a queued item is known").to.equal("queued");
    claimGate.open();
    const [[a], [b]] = [await claimed.awaitNext(), await claimed.awaitNext()];
    expect([a.id, b.id]).to.have.members([older.item.id, newer.item.id]);
    for (const id of [older.item.id, newer.item.id]) expect(await itemReaches(d, id, ["succeeded", "failed"])).to.deep.include({ state: "succeeded", attempts: 1 });
    expect(claimsStarted).to.be.at.least(1);
    expect(d.stats().counters.claimedDirectly).to.equal(0);
    await release(d);
  });

  it("queues the submit when an eligible older item waits that the fylr never heard of (a delay that ran out)", async () => {
    const d = await idle(4);
    const passes = new EventMonitor(d.events, "pass");
    // An item due in an hour: its notification wakes the fylr, whose claim finds nothing due.
    const later = await queueElsewhere({ calls: [cat("older")], startAfter: new Date(Date.now() + 3_600_000) });
    await passes.awaitCount(1);
    // Its delay runs out without a notification (an UPDATE of a queued row to queued sends none).
    await pool.query("UPDATE queue_items SET start_after = now() - interval '1 second' WHERE id = $1", [later.item.id]);
    const claimed = new EventMonitor(d.events, "item:claimed");
    const newer = await d.submit({ calls: [cat("newer")] });
    expect(newer.item.state, "never ahead of an eligible item of its priority").to.equal("queued");
    // The insert's notification wakes the claim, which takes the older one first.
    const [[first], [second]] = [await claimed.awaitNext(), await claimed.awaitNext()];
    expect(first.id).to.equal(later.item.id);
    expect(second.id).to.equal(newer.item.id);
    for (const id of [later.item.id, newer.item.id]) await itemReaches(d, id, ["succeeded"]);
    await release(d);
  });

  it("queues the submit when the fylr's row is gone (declared dead): a dead fylr claims nothing", async () => {
    const d = await idle(4, new TestBackend(), { heartbeatIntervalMs: 60_000 });
    await pool.query("DELETE FROM fylrs WHERE id = $1", [d.fylrId]);
    const { item } = await d.submit({ calls: [cat("orphan")] });
    expect(item).to.deep.include({ state: "queued", lease: 0, attempts: 0 });
    expect(item.claimedBy).to.equal(undefined);
    // Nobody claims it while the fylr has no row; once it is back, the poke's pass does.
    await queue.registerFylr({ id: d.fylrId, hostname: "test", pid: process.pid });
    d.poke();
    expect(await itemReaches(d, item.id, ["succeeded", "failed"])).to.deep.include({ state: "succeeded", claimedBy: d.fylrId, attempts: 1 });
    expect(d.stats().counters.claimedDirectly).to.equal(0);
    await release(d);
  });

  it("many concurrent submits never hold more exec places than admission", async () => {
    const gate = new Gate();
    const d = await idle(4, gated(gate));
    let maxHeld = 0;
    const stop = d.events.on("item:claimed", () => (maxHeld = Math.max(maxHeld, d.stats().execHeld)));
    const submit = d.queue.submit.bind(d.queue);
    let asked = 0;
    d.queue.submit = (n, claimFor) => {
      if (claimFor) asked += 1;
      return submit(n, claimFor);
    };
    const results = await Promise.all(Array.from({ length: 24 }, (_, i) => d.submit({ calls: [cat(`${i}`)] })));
    // All 24 were on their way at once: only the 4 that got a reserved place asked to be
    // claimed. (Postgres may queue some of those too: a sibling submit committed first is
    // queued work they must not pass.)
    expect(asked, "inserts sent as direct claims").to.equal(4);
    const direct = results.filter((r) => r.item.state === "claimed");
    expect(direct.length, "claimed in their insert").to.be.at.most(4);
    const held = await pool.query<{ n: number }>("SELECT count(*)::int AS n FROM queue_items WHERE state IN ('claimed', 'running')");
    expect(held.rows[0]!.n, "held in the database").to.be.at.most(4);
    expect(d.stats().execHeld).to.be.at.most(4);
    // The counter follows the written success a moment later: wait for all 24 events.
    const succeeded = new EventMonitor(d.events, "item:succeeded");
    gate.open();
    for (const { item } of results) expect(await itemReaches(d, item.id, ["succeeded", "failed"])).to.deep.include({ state: "succeeded", attempts: 1, lease: 1 });
    await succeeded.awaitCount(24);
    succeeded.release();
    stop();
    expect(maxHeld, "held at any claim").to.be.at.most(4);
    expect(d.stats().counters).to.include({ claimed: 24, succeeded: 24, claimedDirectly: direct.length });
    await release(d);
  });

  it("cancels a directly claimed item: its task stops and it ends cancelled", async () => {
    const gate = new Gate();
    const d = await idle(4, gated(gate));
    const started = new EventMonitor(d.events, "item:started");
    const { item } = await d.submit({ calls: [cat("never")] });
    expect(item.state).to.equal("claimed");
    await started.awaitNext();
    const cancelled = new EventMonitor(d.events, "item:cancelled");
    const result = await d.cancel(item.id);
    expect(result.previous).to.equal("running");
    await cancelled.awaitNext({ filter: (i) => i.id === item.id });
    expect(await stateOf(item.id)).to.deep.include({ state: "cancelled", attempts: 1 });
    // Its place is free again: the next submit is claimed directly too.
    gate.open();
    const next = await d.submit({ calls: [cat("after")] });
    expect(next.item.state).to.equal("claimed");
    await itemReaches(d, next.item.id, ["succeeded"]);
    await release(d);
  });

  it("an idempotent resubmit returns the first item and starts nothing more", async () => {
    const d = await idle(4);
    const [a, b] = await Promise.all([
      d.submit({ calls: [cat("once")], idempotencyKey: "direct-key" }),
      d.submit({ calls: [cat("once")], idempotencyKey: "direct-key" }),
    ]);
    expect([a.created, b.created].sort()).to.deep.equal([false, true]);
    expect(a.item.id).to.equal(b.item.id);
    await itemReaches(d, a.item.id, ["succeeded"]);
    const again = await d.submit({ calls: [cat("once")], idempotencyKey: "direct-key" });
    expect(again).to.deep.include({ created: false });
    expect(again.item).to.deep.include({ id: a.item.id, state: "succeeded", lease: 1 });
    expect(d.stats().counters).to.include({ claimed: 1, succeeded: 1 });
    // No place stayed reserved by the refused inserts: the whole share is still free.
    expect(d.stats().execHeld).to.equal(0);
    const more = await Promise.all(Array.from({ length: 4 }, (_, i) => d.submit({ calls: [cat(`${i}`)] })));
    expect(more.filter((r) => r.item.state === "claimed").length).to.be.at.least(1);
    for (const { item } of more) await itemReaches(d, item.id, ["succeeded"]);
    await release(d);
  });

  it("a submit taking an upload is claimed in its insert; a refused adoption leaves no item and no reserved place", async () => {
    // The in-test backend takes bytes: read the stored upload's stream first.
    const backend = new TestBackend(async (request, options) => {
      const stdin = request.stdin instanceof Readable ? Buffer.concat(await request.stdin.toArray()) : request.stdin;
      return runLocally({ ...request, stdin }, options);
    });
    const d = await idle(1, backend);
    const upload = async (text: string): Promise<string> => {
      const writer = d.blobs.createWriter({ role: "input" });
      await pipeline(Readable.from([Buffer.from(text)]), writer);
      return writer.result!.id;
    };
    const id = await upload("uploaded");
    const { item } = await d.submit({ calls: [{ service: "cat", args: [], env: {}, stdin: { kind: "upload", id } }] });
    expect(item.state).to.equal("claimed");
    expect((await itemReaches(d, item.id, ["succeeded", "failed"])).output!.toString()).to.equal("uploaded");
    const refused = await d.submit({ calls: [{ service: "cat", args: [], env: {}, stdin: { kind: "upload", id } }] }).then(
      () => undefined,
      (err: Error) => err,
    );
    expect(refused?.message).to.match(/no upload .* to take/);
    expect((await pool.query("SELECT 1 FROM queue_items")).rowCount).to.equal(1);
    const next = await d.submit({ calls: [cat("next")] });
    expect(next.item.state, "the one place of admission was given back").to.equal("claimed");
    await itemReaches(d, next.item.id, ["succeeded"]);
    await release(d);
  });

  it("a stop that begins while the insert is on its way starts nothing: the claimed item goes back to the queue", async () => {
    const d = await idle(4);
    const submit = d.queue.submit.bind(d.queue);
    let stopped: Promise<void> | undefined;
    d.queue.submit = async (...args) => {
      const result = await submit(...args);
      stopped = d.stop({ graceMs: 0 });
      return result;
    };
    const claimed = new EventMonitor(d.events, "item:claimed");
    const { item } = await d.submit({ calls: [cat("late")] });
    expect(item.state, "inserted claimed").to.equal("claimed");
    await stopped;
    expect(claimed.all, "tasks started").to.have.length(0);
    await awaitRow(item.id, (row) => row.state === "queued");
    expect(await stateOf(item.id)).to.deep.include({ state: "queued", attempts: 0, lease: 1, claimedBy: undefined });
    await release(d);
  });

  it("the submit's caller goes on before the task starts (a Submit's answer is written first); the task then runs the item once", async () => {
    const backend = new TestBackend();
    const d = await idle(1, backend);
    const order: string[] = [];
    const stop = d.events.on("item:claimed", () => order.push("task started"));
    const { item } = await d.submit({ calls: [cat("answer first")] });
    order.push("caller went on");
    expect(item.state).to.equal("claimed");
    expect(backend.requests, "exec calls before the caller went on").to.have.length(0);
    expect((await itemReaches(d, item.id, ["succeeded", "failed"])).output!.toString()).to.equal("answer first");
    expect(order).to.deep.equal(["caller went on", "task started"]);
    expect(backend.requests).to.have.length(1);
    stop();
    // Its place was held from the insert to the task: the next submit finds it free again.
    const next = await d.submit({ calls: [cat("next")] });
    expect(next.item.state).to.equal("claimed");
    await itemReaches(d, next.item.id, ["succeeded"]);
    expect(d.stats().counters).to.include({ claimed: 2, claimedDirectly: 2, succeeded: 2 });
    await release(d);
  });

  it("while the task of a directly claimed item is not started yet, its place stays taken: the caller's next submit is queued", async () => {
    const d = await idle(1);
    const first = await d.submit({ calls: [cat("first")] });
    const second = await d.submit({ calls: [cat("second")] });
    expect([first.item.state, second.item.state]).to.deep.equal(["claimed", "queued"]);
    for (const { item } of [first, second]) expect(await itemReaches(d, item.id, ["succeeded", "failed"])).to.deep.include({ state: "succeeded", attempts: 1 });
    await release(d);
  });

  it("a stop asked for by the submit's caller as it goes on starts nothing: the claimed item goes back to the queue", async () => {
    const backend = new TestBackend();
    const d = await idle(4, backend);
    const claimed = new EventMonitor(d.events, "item:claimed");
    const { item } = await d.submit({ calls: [cat("stopped first")] });
    expect(item.state, "inserted claimed").to.equal("claimed");
    await d.stop({ graceMs: 0 });
    expect(claimed.all, "tasks started").to.have.length(0);
    expect(backend.requests, "exec calls").to.have.length(0);
    await awaitRow(item.id, (row) => row.state === "queued");
    expect(await stateOf(item.id)).to.deep.include({ state: "queued", attempts: 0, lease: 1, claimedBy: undefined });
    await release(d);
  });

  it("a fylr killed after a direct claim: a sibling's sweep requeues the item and it runs once", async () => {
    const victim = startClaimer(["direct", url, "2"]);
    const victimId = (await victim.awaitLine((l) => "fylrId" in l)).fylrId as string;
    await victim.awaitLine((l) => l.holding === 2);
    const submitted = victim.lines.filter((l) => "submitted" in l);
    expect(submitted.map((l) => l.state)).to.deep.equal(["claimed", "claimed"]);
    const ids = submitted.map((l) => l.submitted as string);
    for (const id of ids) expect(await stateOf(id)).to.deep.include({ state: "running", claimedBy: victimId, lease: 1, attempts: 1 });
    victim.child.kill("SIGKILL");
    await victim.exited;
    const survivor = await startDispatcher({ pool, capacity: new ManualCapacitySource([instance(4)]), backend: new TestBackend(), config: { pollIntervalMs: 50, heartbeatIntervalMs: 100, staleAfterMs: 1000 } });
    const succeeded = new EventMonitor(survivor.events, "item:succeeded");
    for (const id of ids) expect(await itemReaches(survivor, id, ["succeeded", "failed"])).to.deep.include({ state: "succeeded", claimedBy: survivor.fylrId, lease: 2, attempts: 2 });
    // The row is written before the survivor counts it: wait for its events, not the rows.
    await succeeded.awaitCount(2);
    expect(survivor.stats().counters).to.include({ orphansRescued: 2, claimed: 2, succeeded: 2 });
    // The dead owner's lease is refused.
    expect(await queue.release({ id: ids[0]!, claimedBy: victimId, lease: 1 }, 0)).to.equal(false);
    await release(survivor);
    await release(victim.child);
  });
});
