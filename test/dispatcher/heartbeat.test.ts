// The heartbeat runs on a loop of its own: neither a stuck claim pass nor a graceful stop
// that waits for running items holds it back (either would let siblings declare a live
// fylr dead and run its items a second time).
import { expect } from "chai";
import type pg from "pg";
import { ManualCapacitySource, migrate, type DispatcherConfig } from "../../src/dispatcher/index.js";
import { EventMonitor } from "../support/event-monitor.js";
import { createTestDatabase } from "../support/postgres.js";
import { release } from "../../harness/resources.js";
import { closeAll, Gate, openPool, receiptFor, startDispatcher, TestBackend } from "./support.js";

const config: Partial<DispatcherConfig> = { pollIntervalMs: 60_000, heartbeatIntervalMs: 100, staleAfterMs: 1000 };
const exec = { instanceId: "exec-1", address: "127.0.0.1:7600", capacity: 4, clients: 1 };

describe("dispatcher heartbeat", function () {
  this.timeout(60_000);
  let url: string;
  let pool: pg.Pool;
  before(async () => {
    url = await createTestDatabase("heartbeat");
    await migrate(url);
  });
  beforeEach(async () => {
    pool = openPool(url);
    await pool.query("TRUNCATE queue_items, fylrs CASCADE");
  });
  afterEach(() => closeAll(pool));

  it("beats on while a claim pass is stuck on a locked queue", async () => {
    // No LISTEN: after the first pass, only the poke below starts one (the poll is a minute away).
    const d = await startDispatcher({ pool, capacity: new ManualCapacitySource([exec]), backend: new TestBackend(), config: { ...config, listen: false } });
    const passes = new EventMonitor(d.events, "pass");
    await passes.awaitCount(1);
    const locker = await pool.connect();
    try {
      await locker.query("BEGIN");
      await locker.query("LOCK TABLE queue_items IN ACCESS EXCLUSIVE MODE");
      const wakeups = new EventMonitor(d.events, "wakeup");
      d.poke();
      await wakeups.awaitNext();
      const passesBefore = passes.count;
      // The pass's claim query waits for the lock; three heartbeats come meanwhile.
      const beats = new EventMonitor(d.events, "heartbeat");
      await beats.awaitCount(3);
      expect(beats.all.map(([alive]) => alive)).to.deep.equal([true, true, true]);
      expect(passes.count, "the pass is still stuck").to.equal(passesBefore);
      await locker.query("COMMIT");
      await passes.awaitCount(passesBefore + 1);
    } finally {
      locker.release();
    }
    await release(d);
  });

  it("beats on while every connection of the shared pool is taken", async () => {
    const small = openPool(url, 2);
    const d = await startDispatcher({ pool: small, capacity: new ManualCapacitySource([exec]), backend: new TestBackend(), config: { ...config, listen: false } });
    await new EventMonitor(d.events, "heartbeat").awaitCount(1);
    // What a burst of submits and writes does to the pool: every connection busy, more queued.
    const held = [await small.connect(), await small.connect()];
    try {
      const beats = new EventMonitor(d.events, "heartbeat");
      await beats.awaitCount(3);
      expect([small.totalCount, small.idleCount], "every connection of the shared pool busy").to.deep.equal([2, 0]);
    } finally {
      for (const client of held) client.release();
    }
    await release(d);
    await closeAll(small);
  });

  it("beats on while a graceful stop waits for a running item", async () => {
    const gate = new Gate();
    const backend = new TestBackend(async (_request, options) => {
      options.onStart?.("exec-1");
      await gate.wait(options.signal);
      return { receipt: receiptFor({ exitCode: 0 }), stdout: Buffer.alloc(0) };
    });
    const d = await startDispatcher({ pool, capacity: new ManualCapacitySource([exec]), backend, config: { ...config, stopGraceMs: 30_000 } });
    const started = new EventMonitor(d.events, "item:started");
    const { item } = await d.submit({ calls: [{ service: "cat", args: [], env: {} }] });
    await started.awaitNext();
    const beats = new EventMonitor(d.events, "heartbeat");
    const stopped = d.stop();
    expect(d.state).to.equal("stopping");
    // Longer than staleAfter (1 s): a fylr that stopped beating here would be declared dead.
    await beats.awaitCount(12);
    expect(d.state).to.equal("stopping");
    expect(beats.all.every(([alive]) => alive)).to.equal(true);
    gate.open();
    await stopped;
    expect((await d.get(item.id))?.state).to.equal("succeeded");
    await release(d);
  });
});
