// LISTEN/NOTIFY wakeups between dispatchers on one database (see migrations/0002_notify.sql).
// The woken dispatchers poll only once a minute here, so anything that happens within
// seconds was a notification.
import { expect } from "chai";
import type pg from "pg";
import { createDefaultActions, Dispatcher, ManualCapacitySource, migrate, normalizeSubmit, QueueStore, type DispatcherConfig } from "../../src/dispatcher/index.js";
import { EventMonitor } from "../support/event-monitor.js";
import { createTestDatabase } from "../support/postgres.js";
import { release, track } from "../../harness/resources.js";
import { openPool, TestBackend } from "./support.js";

const tracked = (d: Dispatcher): Dispatcher => track(d, `dispatcher ${d.fylrId}`, (x) => x.stop({ graceMs: 0 }).catch(() => undefined));

const slowPoll: Partial<DispatcherConfig> = { pollIntervalMs: 60_000, heartbeatIntervalMs: 100, staleAfterMs: 120_000 };
const exec = { instanceId: "exec-1", address: "127.0.0.1:7600", capacity: 4, clients: 1 };
const cat = { service: "cat", args: [], env: {} };

describe("dispatcher wakeups (LISTEN/NOTIFY)", function () {
  this.timeout(60_000);
  let url: string;
  let pool: pg.Pool;
  before(async () => {
    url = await createTestDatabase("wakeups");
    await migrate(url);
  });
  beforeEach(async () => {
    pool = openPool(url);
    await pool.query("TRUNCATE queue_items, fylrs CASCADE");
  });
  afterEach(() => release(pool));

  // A claims nothing exec-bound (no capacity); B claims, and polls once a minute.
  async function pair(listen = true): Promise<{ a: Dispatcher; b: Dispatcher }> {
    const start = async (capacity: ManualCapacitySource): Promise<Dispatcher> => {
      const d = tracked(new Dispatcher({ pool, capacity, backend: new TestBackend(), migrate: false, config: { ...slowPoll, listen } }));
      const passes = new EventMonitor(d.events, "pass");
      const up = new EventMonitor(d.events, "notify:up");
      await d.start();
      // The first pass, and with LISTEN the pass its "up" asks for: then the next poll is a minute away.
      if (listen) await up.awaitNext();
      await passes.awaitCount(listen ? 2 : 1);
      return d;
    };
    return { a: await start(new ManualCapacitySource()), b: await start(new ManualCapacitySource([exec])) };
  }

  it("a submit on one fylr wakes another fylr's claim loop at once, with no poll due", async () => {
    const { a, b } = await pair();
    const claimed = new EventMonitor(b.events, "item:claimed");
    const woken = new EventMonitor(b.events, "wakeup");
    const { item } = await a.submit({ calls: [cat] });
    const [got] = await claimed.awaitNext({ timeoutMs: 5_000 });
    expect(got.id).to.equal(item.id);
    expect(woken.all.map(([source]) => source)).to.include("notify").and.not.include("poll");
    await release(a);
    await release(b);
  });

  it("a state change made by another fylr wakes this fylr's followers of that item", async () => {
    const { a, b } = await pair();
    const changed = new EventMonitor(a.events, "queue:changed");
    const succeeded = new EventMonitor(b.events, "item:succeeded");
    const { item } = await a.submit({ calls: [{ ...cat, stdin: { kind: "data", data: Buffer.from("x") } }] });
    const woke: string[] = [];
    const stop = a.followItem(item.id, () => woke.push(item.id));
    const stopOther = a.followItem("00000000-0000-0000-0000-000000000000", () => woke.push("unrelated"));
    await succeeded.awaitNext({ filter: (i) => i.id === item.id });
    // A never held the item: the notifications of B's claim, start and success reached it.
    await changed.awaitNext({ filter: (id) => id === item.id, timeoutMs: 5_000 });
    expect(woke).to.include(item.id).and.not.include("unrelated");
    stop();
    stopOther();
    await release(a);
    await release(b);
  });

  it("a burst of notifications sends a claim statement at most once per 10 ms", async () => {
    const { a, b } = await pair();
    // B has capacity: every notification may have queued something it could claim, so a
    // woken pass asks Postgres. Count those statements.
    const claimsAt: number[] = [];
    const claim = b.queue.claim.bind(b.queue);
    b.queue.claim = (...args) => {
      claimsAt.push(performance.now());
      return claim(...args);
    };
    const passes = new EventMonitor(b.events, "pass");
    // 40 commits 2 ms apart, each one NOTIFY; the queue stays empty.
    await pool.query(Array.from({ length: 40 }, () => "BEGIN; SELECT pg_notify('slotbroker_queue', 'queued'), pg_sleep(0.002); COMMIT;").join(" "));
    await passes.awaitCount(1);
    b.queue.claim = claim;
    expect(claimsAt.length, "claims started by the burst").to.be.within(1, 39);
    for (let i = 1; i < claimsAt.length; i++) expect(claimsAt[i]! - claimsAt[i - 1]!, `gap before claim ${i} of ${claimsAt.length}`).to.be.at.least(8);
    await release(a);
    await release(b);
  });

  it("a pass that asked Postgres nothing does not hold back the next claim", async () => {
    const { a, b } = await pair();
    // A has no capacity: its passes send no statement, so notifications wake it at once.
    const wakeups: number[] = [];
    const stop = a.events.on("wakeup", (source) => source === "notify" && wakeups.push(performance.now()));
    const passes = new EventMonitor(a.events, "pass");
    await pool.query(Array.from({ length: 20 }, () => "BEGIN; SELECT pg_notify('slotbroker_queue', 'queued'), pg_sleep(0.002); COMMIT;").join(" "));
    await passes.awaitCount(1);
    stop();
    // Twenty notifications 2 ms apart. Passes held back to one per 10 ms could never wake
    // closer than 10 ms apart, however loaded the machine; a count would depend on the load.
    expect(wakeups.length, "woken by the burst").to.be.at.least(2);
    const gaps = wakeups.slice(1).map((t, i) => t - wakeups[i]!);
    expect(Math.min(...gaps), `gaps between wakeups: ${gaps.map((g) => g.toFixed(1)).join(", ")} ms`).to.be.below(9);
    await release(a);
    await release(b);
  });

  it("claims a local item queued elsewhere by notification, after passes that skipped the empty local queue", async () => {
    const { a, b } = await pair();
    const passes = new EventMonitor(b.events, "pass");
    const claimed = new EventMonitor(b.events, "item:claimed");
    // Exec-only passes on B (an exec item queued on A, no notification of a local item):
    // B's local claim found nothing before, so these skip it.
    await a.submit({ calls: [cat] });
    await claimed.awaitNext({ timeoutMs: 5_000 });
    await passes.awaitCount(2);
    await release(a); // A would claim local items too
    // A local item written straight into the queue: only its NOTIFY tells B.
    const store = new QueueStore(pool);
    const limits = { maxInputBytes: 1 << 20, defaultMaxAttempts: 3, stdinUrlPrefixes: [] };
    const { item } = await store.submit(normalizeSubmit({ local: { name: "count", params: {}, input: Buffer.from("a b\n") } }, createDefaultActions(), limits));
    const [got] = await claimed.awaitNext({ timeoutMs: 5_000, filter: (i) => i.id === item.id });
    expect(got.kind).to.equal("local");
    await release(b);
  });

  it("notifies \"queued local\" besides \"queued\" only when a local item became queued", async () => {
    const listener = await pool.connect();
    const heard: string[] = [];
    listener.on("notification", (n) => heard.push(n.payload ?? ""));
    try {
      await listener.query("LISTEN slotbroker_queue");
      const store = new QueueStore(pool);
      const limits = { maxInputBytes: 1 << 20, defaultMaxAttempts: 3, stdinUrlPrefixes: [] };
      await store.submit(normalizeSubmit({ calls: [cat] }, createDefaultActions(), limits));
      await store.submit(normalizeSubmit({ local: { name: "count", params: {}, input: Buffer.from("x") } }, createDefaultActions(), limits));
      await listener.query("SELECT 1"); // both commits' notifications are in before this answer
      expect(heard).to.deep.equal(["queued", "queued", "queued local"]);
    } finally {
      await listener.query("UNLISTEN *");
      listener.release();
    }
  });

  it("reconnects after the LISTEN connection is killed, and wakes up again", async () => {
    const { a, b } = await pair();
    const down = new EventMonitor(b.events, "notify:down");
    const up = new EventMonitor(b.events, "notify:up");
    await pool.query("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = current_database() AND query LIKE 'LISTEN %'");
    await down.awaitNext();
    await up.awaitNext();
    expect(b.listening).to.equal(true);
    const claimed = new EventMonitor(b.events, "item:claimed");
    const { item } = await a.submit({ calls: [cat] });
    expect((await claimed.awaitNext({ timeoutMs: 5_000 }))[0].id).to.equal(item.id);
    await release(a);
    await release(b);
  });

  it("with listen off, the other fylr claims nothing until its poll", async () => {
    const { a, b } = await pair(false);
    expect(b.listening).to.equal(false);
    const claimed = new EventMonitor(b.events, "item:claimed");
    await a.submit({ calls: [cat] });
    // A's own claim loop ran after the submit (it has no capacity); B heard nothing.
    await a.events.next("pass");
    await claimed.awaitNext({ timeoutMs: 1_500 }).then(
      () => expect.fail("claimed without a notification or a poll"),
      (err: Error) => expect(err.message).to.match(/no "item:claimed" event/),
    );
    b.poke();
    await claimed.awaitNext();
    await release(a);
    await release(b);
  });
});
