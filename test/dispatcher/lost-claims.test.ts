// A claim statement can commit while its answer never reaches the fylr (the connection
// dies between the commit and the reply): the row says a live fylr holds the item, no task
// runs it, and no sibling's sweep touches a live fylr's claims. The heartbeat loop's audit
// gives such an item back; an item a task does hold is never touched, however old its claim.
import { expect } from "chai";
import type pg from "pg";
import { ManualCapacitySource, migrate, type DispatcherConfig } from "../../src/dispatcher/index.js";
import { EventMonitor } from "../support/event-monitor.js";
import { createTestDatabase } from "../support/postgres.js";
import { release } from "../../harness/resources.js";
import { closeAll, Gate, openPool, receiptFor, startDispatcher, TestBackend } from "./support.js";

// The audit runs every staleAfter (500 ms) and counts claims older than 4 × staleAfter.
const config: Partial<DispatcherConfig> = { pollIntervalMs: 60_000, heartbeatIntervalMs: 100, staleAfterMs: 500, listen: false };
const exec = { instanceId: "exec-1", address: "127.0.0.1:7600", capacity: 4, clients: 1 };

const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));

describe("dispatcher audit of held claims", function () {
  this.timeout(60_000);
  let url: string;
  let pool: pg.Pool;
  before(async () => {
    url = await createTestDatabase("lost_claims");
    await migrate(url);
  });
  beforeEach(async () => {
    pool = openPool(url);
    await pool.query("TRUNCATE queue_items, fylrs CASCADE");
  });
  afterEach(() => closeAll(pool));

  it("gives back an item claimed by this fylr that no task of it holds (a lost claim answer)", async () => {
    // No exec capacity: the submit stays queued, then the row is claimed behind the fylr's back.
    const d = await startDispatcher({ pool, capacity: new ManualCapacitySource([]), backend: new TestBackend(), config });
    await new EventMonitor(d.events, "heartbeat").awaitCount(1);
    const { item } = await d.submit({ calls: [{ service: "cat", args: [], env: {} }] });
    await pool.query(
      `UPDATE queue_items SET state = 'claimed', claimed_by = $2, lease = lease + 1, attempts = attempts + 1, claimed_at = now() - interval '1 hour' WHERE id = $1`,
      [item.id, d.fylrId],
    );
    const deadline = Date.now() + 10_000;
    let row: { state: string; claimed_by: string | null; attempts: number } | undefined;
    while (Date.now() < deadline) {
      row = (await pool.query<{ state: string; claimed_by: string | null; attempts: number }>("SELECT state, claimed_by, attempts FROM queue_items WHERE id = $1", [item.id])).rows[0];
      if (row?.state === "queued") break;
      await sleep(100);
    }
    expect(row).to.deep.equal({ state: "queued", claimed_by: null, attempts: 0 });
    await release(d);
  });

  it("leaves alone an item a task holds, however old its claim", async () => {
    const gate = new Gate();
    const backend = new TestBackend(async (_request, options) => {
      options.onStart?.("exec-1");
      await gate.wait(options.signal);
      return { receipt: receiptFor({ exitCode: 0 }), stdout: Buffer.alloc(0) };
    });
    const d = await startDispatcher({ pool, capacity: new ManualCapacitySource([exec]), backend, config });
    const started = new EventMonitor(d.events, "item:started");
    const { item } = await d.submit({ calls: [{ service: "cat", args: [], env: {} }] });
    await started.awaitNext();
    const before = (await pool.query<{ lease: string }>("UPDATE queue_items SET claimed_at = now() - interval '1 hour' WHERE id = $1 RETURNING lease", [item.id])).rows[0];
    // Three audits at least.
    await sleep(2000);
    const row = (await pool.query<{ state: string; claimed_by: string; lease: string }>("SELECT state, claimed_by, lease FROM queue_items WHERE id = $1", [item.id])).rows[0];
    expect(row).to.deep.equal({ state: "running", claimed_by: d.fylrId, lease: before!.lease });
    gate.open();
    const succeeded = new EventMonitor(d.events, "item:succeeded");
    await succeeded.awaitNext();
    expect((await d.get(item.id))?.state).to.equal("succeeded");
    await release(d);
  });
});
