// The store side of cancel on a real Postgres: a pending cancel wins over every write that
// would put the item back in the queue (a failed attempt, a release, the stale-claim
// rescue), the cancel bound, the holder's check, and idempotency.
import { expect } from "chai";
import type pg from "pg";
import { createDefaultActions, ItemControlStore, migrate, normalizeSubmit, QueueStore, type ClaimedItem } from "../../src/dispatcher/index.js";
import { createTestDatabase } from "../support/postgres.js";
import { closeAll, openPool } from "./support.js";

const lowest = -2_147_483_648;

describe("item control store", () => {
  let url: string;
  let pool: pg.Pool;
  let queue: QueueStore;
  let control: ItemControlStore;

  before(async () => {
    url = await createTestDatabase("control");
    await migrate(url);
  });
  beforeEach(async () => {
    pool = openPool(url);
    queue = new QueueStore(pool);
    control = new ItemControlStore(pool);
    await pool.query("TRUNCATE queue_items, fylrs CASCADE");
    await queue.registerFylr({ id: "fylr-a", hostname: "h", pid: 1 });
  });
  afterEach(() => closeAll(pool));

  async function runningItem(maxAttempts = 3): Promise<ClaimedItem> {
    const n = normalizeSubmit({ calls: [{ service: "cat", args: [], env: {} }], maxAttempts }, createDefaultActions(), { maxInputBytes: 1024, defaultMaxAttempts: 3 });
    await queue.submit(n);
    const [item] = await queue.claim("fylr-a", "exec", lowest, 1);
    expect(await queue.markRunning(item!)).to.equal(true);
    return item!;
  }

  it("a running item's cancel is a request; repeating it changes nothing", async () => {
    const item = await runningItem();
    const first = await control.cancel(item.id);
    expect(first.previous).to.equal("running");
    expect(first.item.state).to.equal("running");
    const at = first.item.cancelRequestedAt!;
    const again = await control.cancel(item.id);
    expect(again.item.cancelRequestedAt!.getTime()).to.equal(at.getTime());
    expect(await control.cancelledAmong([item.id])).to.deep.equal([item.id]);
  });

  it("a failed attempt or a release of an item with a cancel pending ends it cancelled, never queued", async () => {
    const failing = await runningItem();
    await control.cancel(failing.id);
    expect(await queue.failAttempt(failing, [], "boom", 0, false)).to.equal("cancelled");
    const released = await runningItem();
    await control.cancel(released.id);
    expect(await queue.release(released, 0)).to.equal(true);
    expect((await queue.get(released.id))!.state).to.equal("cancelled");
    // A fenced write after that is refused.
    expect(await queue.complete(released, [], undefined)).to.equal(false);
  });

  it("the stale-claim rescue cancels a dead fylr's item whose cancel is pending", async () => {
    const item = await runningItem();
    await control.cancel(item.id);
    await pool.query("UPDATE fylrs SET heartbeat_at = now() - interval '1 hour' WHERE id = 'fylr-a'");
    const reaped = await queue.reapStale(1000, "fylr-b");
    expect(reaped.cancelled.map((c) => c.id)).to.deep.equal([item.id]);
    expect(reaped.requeued).to.deep.equal([]);
    expect((await queue.get(item.id))!.state).to.equal("cancelled");
  });

  it("the cancel bound cancels an item whose job never confirmed, also with its fylr alive", async () => {
    const item = await runningItem();
    await control.cancel(item.id);
    expect(await control.cancelOverdue(60_000)).to.deep.equal([]);
    await pool.query("UPDATE queue_items SET cancel_requested_at = now() - interval '2 minutes' WHERE id = $1", [item.id]);
    expect(await control.cancelOverdue(60_000)).to.deep.equal([item.id]);
    const after = (await queue.get(item.id))!;
    expect(after.state).to.equal("cancelled");
    expect(after.error).to.match(/cancel bound/);
    expect(await queue.complete(item, [], undefined)).to.equal(false);
  });
});
