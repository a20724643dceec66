// Several fylrs on one database: claim shares and crash recovery. The exec backend is the
// in-test one (support.ts); real execservers come with the fylr side's integration tests.
import { expect } from "chai";
import type pg from "pg";
import {
  createDefaultActions,
  ManualCapacitySource,
  migrate,
  normalizeSubmit,
  QueueStore,
  type Dispatcher,
  type DispatcherConfig,
  type ExecInstance, inlineOutput } from "../../src/dispatcher/index.js";
import { createTestDatabase } from "../support/postgres.js";
import { release } from "../../harness/resources.js";
import { EventMonitor } from "../support/event-monitor.js";
import { closeAll, Gate, itemReaches, morePasses, openPool, receiptFor, runLocally, SlotModel, startClaimer, startDispatcher, TestBackend } from "./support.js";

const fast: Partial<DispatcherConfig> = { pollIntervalMs: 50, heartbeatIntervalMs: 100, staleAfterMs: 1000 };

describe("a fleet of fylrs on one database", () => {
  let url: string;
  let pool: pg.Pool;
  before(async () => {
    url = await createTestDatabase("fleet");
    await migrate(url);
  });
  beforeEach(async () => {
    pool = openPool(url);
    await pool.query("TRUNCATE queue_items, fylrs CASCADE");
  });
  afterEach(async () => {
    await closeAll(pool);
  });

  const heldByFylr = async (): Promise<Record<string, number>> => {
    const r = await pool.query<{ claimed_by: string; n: number }>(
      "SELECT claimed_by, count(*)::int AS n FROM queue_items WHERE state IN ('claimed', 'running') GROUP BY claimed_by",
    );
    return Object.fromEntries(r.rows.map((row) => [row.claimed_by, row.n]));
  };

  it("5 fylrs on one 40-slot execserver never hold more than 10 exec items each, and survivors' shares grow", async () => {
    // headroom 2 (the default) is what makes the cap 10: ceil(40 / 5) + 2.
    const execserver = new SlotModel(40);
    const gate = new Gate();
    const backend = new TestBackend(async (_request, options) => {
      const freeSlot = await execserver.acquire(options.signal);
      try {
        options.onStart?.("exec-40");
        await gate.wait(options.signal);
        return { receipt: receiptFor({ exitCode: 0, instanceId: "exec-40" }), stdout: Buffer.alloc(0) };
      } finally {
        freeSlot();
      }
    });
    const instance = (clients: number): ExecInstance => ({ instanceId: "exec-40", address: "exec:7600", capacity: 40, clients });
    const sources = [0, 1, 2, 3, 4].map(() => new ManualCapacitySource([instance(5)]));
    const pools = sources.map(() => openPool(url, 4));
    const fylrs: Dispatcher[] = [];
    for (const [i, capacity] of sources.entries()) fylrs.push(await startDispatcher({ pool: pools[i]!, capacity, backend, config: { ...fast, headroom: 2 } }));
    // The most each fylr ever held, sampled on every change of its in-memory table.
    const most = new Map<string, number>(fylrs.map((f) => [f.fylrId, 0]));
    for (const f of fylrs) f.events.on("item:changed", () => most.set(f.fylrId, Math.max(most.get(f.fylrId)!, f.stats().execHeld)));
    const queue = new QueueStore(pool);
    const total = 120;
    const claims = fylrs.map((f) => new EventMonitor(f.events, "item:claimed"));
    let succeeded = 0;
    let onAllSucceeded: () => void = () => undefined;
    const allSucceeded = new Promise<void>((resolve) => (onAllSucceeded = resolve));
    for (const f of fylrs) {
      f.events.on("item:succeeded", () => {
        if (++succeeded === total) onAllSucceeded();
      });
    }
    for (let i = 0; i < total; i++) await fylrs[i % 5]!.submit({ calls: [{ service: "cat", args: [], env: {} }] });

    // Every fylr fills its share (nothing finishes while the gate is shut).
    await Promise.all(claims.map((c) => c.awaitCount(10, 20_000)));
    // Give every loop a few more passes to over-claim if it were going to.
    await morePasses(fylrs, 5);
    expect(fylrs.map((f) => f.stats().execAdmission)).to.deep.equal([10, 10, 10, 10, 10]);
    expect(Object.values(await heldByFylr())).to.deep.equal([10, 10, 10, 10, 10]);
    expect([...most.values()], "the most each fylr ever held").to.deep.equal([10, 10, 10, 10, 10]);
    expect((await queue.countOpen()).find((c) => c.state === "queued")?.count).to.equal(total - 50);

    // One fylr leaves; the execserver now reports 4 clients and the others' shares grow.
    await release(fylrs[0]);
    for (const s of sources.slice(1)) s.set([instance(4)]);
    await Promise.all(claims.slice(1).map((c) => c.awaitCount(12, 20_000)));
    await morePasses(fylrs.slice(1), 5);
    expect(fylrs.slice(1).map((f) => f.stats().execHeld)).to.deep.equal([12, 12, 12, 12]);
    expect(fylrs.slice(1).map((f) => f.stats().execAdmission)).to.deep.equal([12, 12, 12, 12]);

    gate.open();
    await allSucceeded;
    expect(await queue.countOpen()).to.deep.equal([]);
    expect([...most.values()]).to.deep.equal([10, 12, 12, 12, 12]);
    const done = await pool.query<{ n: number }>("SELECT count(*)::int AS n FROM queue_items WHERE state = 'succeeded'");
    expect(done.rows[0]!.n).to.equal(total);
    for (const f of fylrs) await release(f);
    await closeAll(...pools);
  });

  it("requeues the claims of a fylr killed with SIGKILL through a survivor, who finishes them; the dead lease is refused", async () => {
    const queue = new QueueStore(pool);
    const ids: string[] = [];
    for (let i = 0; i < 4; i++) {
      const n = normalizeSubmit({ calls: [{ service: "cat", args: [], env: {}, stdin: { kind: "data", data: Buffer.from(`item ${i}`) } }] }, createDefaultActions(), {
        maxInputBytes: 1024,
        defaultMaxAttempts: 3,
      });
      ids.push((await queue.submit(n)).item.id);
    }
    const victim = startClaimer(["hold", url, "4"]);
    await victim.awaitLine((l) => l.holding === 4);
    const victimId = (await victim.awaitLine((l) => "fylrId" in l)).fylrId as string;
    const held = await queue.listFylrs();
    expect(held.find((f) => f.id === victimId)?.held).to.equal(4);
    const before = await Promise.all(ids.map((id) => queue.get(id)));
    expect(before.every((i) => i?.state === "running" && i.claimedBy === victimId && i.lease === 1)).to.equal(true);

    victim.child.kill("SIGKILL");
    await victim.exited;
    const survivor = await startDispatcher({
      pool,
      capacity: new ManualCapacitySource([{ instanceId: "x", address: "x:1", capacity: 4, clients: 1 }]),
      backend: new TestBackend(runLocally),
      config: fast,
    });
    for (const [i, id] of ids.entries()) {
      const item = await itemReaches(survivor, id, ["succeeded", "failed"]);
      expect(item).to.deep.include({ state: "succeeded", claimedBy: survivor.fylrId, lease: 2, attempts: 2 });
      expect(item.output!.toString()).to.equal(`item ${i}`);
    }
    expect(survivor.stats().counters.orphansRescued).to.equal(4);
    expect((await queue.listFylrs()).map((f) => f.id)).to.not.include(victimId);
    // The dead owner's late completion, had it come, is refused by the fence.
    const late = await queue.complete({ id: ids[0]!, claimedBy: victimId, lease: 1 }, [], inlineOutput(Buffer.from("late")));
    expect(late).to.equal(false);
    expect((await queue.get(ids[0]!))!.output!.toString()).to.equal("item 0");
    await release(survivor);
    await release(victim.child);
  });
});
