// After a database outage every fylr's heartbeat is stale at once. The first fylr to reach
// the database again must not take that for its siblings' death and requeue their claims
// (they would run twice): a fylr sweeps others' claims only after it has itself been
// healthy for the stale threshold. Each fylr reaches the real Postgres through its own
// chaos proxy, so the test decides who gets the database back first.
import { expect } from "chai";
import type pg from "pg";
import { ManualCapacitySource, migrate, QueueStore, type Dispatcher, type DispatcherConfig, type ExecInstance } from "../../src/dispatcher/index.js";
import { ChaosProxy } from "../../harness/chaos-proxy.js";
import { createTestDatabase } from "../support/postgres.js";
import { release, track } from "../../harness/resources.js";
import { waitFor } from "../../harness/execserver-process.js";
import { closeAll, Gate, openPool, receiptFor, startDispatcher, TestBackend } from "./support.js";

// headroom 0: each fylr's share is ⌈4 / 2⌉ = 2, so both hold items whoever claims first.
const fast: Partial<DispatcherConfig> = { pollIntervalMs: 50, heartbeatIntervalMs: 100, staleAfterMs: 3000, retryInitialMs: 20, retryMaxMs: 100, maxClaimBatch: 2, headroom: 0 };
const one: ExecInstance = { instanceId: "exec-1", address: "127.0.0.1:7600", capacity: 4, clients: 2 };
const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));

describe("dispatcher after a database outage", function () {
  this.timeout(60_000);
  let url: string;
  before(async () => {
    url = await createTestDatabase("outage");
    await migrate(url);
  });

  it("requeues no live sibling's claims when every heartbeat went stale in an outage", async () => {
    const gate = new Gate();
    const backend = (): TestBackend =>
      new TestBackend(async (_request, options) => {
        options.onStart?.("exec-1");
        await gate.wait(options.signal);
        return { receipt: receiptFor({ exitCode: 0, stdout: Buffer.from("ok") }), stdout: Buffer.from("ok") };
      });
    const target = new URL(url);
    const proxies = await Promise.all([0, 1].map(async () => track(await ChaosProxy.start(`${target.hostname}:${target.port}`), "pg proxy", (p) => p.close())));
    const pools: pg.Pool[] = proxies.map((p) => {
      const via = new URL(url);
      via.port = p.address.split(":")[1]!;
      return openPool(via.toString(), 4);
    });
    const direct = openPool(url, 2);
    const queue = new QueueStore(direct);
    const [a, b] = (await Promise.all(pools.map((pool) => startDispatcher({ pool, capacity: new ManualCapacitySource([one]), backend: backend(), config: fast })))) as [Dispatcher, Dispatcher];
    const ids: string[] = [];
    for (let i = 0; i < 4; i++) ids.push((await a.submit({ calls: [{ service: "cat", args: [], env: {} }] })).item.id);
    await waitFor("all four items running", async () => (await Promise.all(ids.map((id) => queue.get(id)))).every((i) => i?.state === "running"));
    const owners = new Set((await Promise.all(ids.map((id) => queue.get(id)))).map((i) => i!.claimedBy));
    expect(owners.size, "both fylrs hold items").to.equal(2);

    // The database is gone for both, longer than the stale threshold…
    for (const p of proxies) p.block();
    await sleep(1.2 * fast.staleAfterMs!);
    // …and comes back for a first, a moment before b: b's heartbeat is old, but b is as
    // alive as a.
    proxies[0]!.unblock();
    await waitFor("a's heartbeat after the outage", async () => (await queue.listFylrs()).some((f) => f.id === a.fylrId && Date.now() - f.heartbeatAt.getTime() < 300));
    await sleep(300);
    proxies[1]!.unblock();
    await waitFor("b's heartbeat after the outage", async () => (await queue.listFylrs()).some((f) => f.id === b.fylrId && Date.now() - f.heartbeatAt.getTime() < 300));
    await sleep(1.5 * fast.staleAfterMs!);

    expect(a.stats().counters.orphansRescued + b.stats().counters.orphansRescued, "claims requeued").to.equal(0);
    gate.open();
    for (const id of ids) {
      const item = await waitFor(`item ${id} to finish`, async () => {
        const i = await queue.get(id);
        return i?.state === "succeeded" ? i : undefined;
      });
      expect(item, `item ${id}`).to.deep.include({ attempts: 1, lease: 1 });
    }
    expect(a.stats().counters.fenced + b.stats().counters.fenced).to.equal(0);
    await closeAll(a, b, ...pools, direct);
    for (const p of proxies) await release(p);
  });
});
