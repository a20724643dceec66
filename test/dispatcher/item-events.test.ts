// The item timeline on a real Postgres: each write that changes an item records its events
// in the same statement (numbered, with fylr, attempt, the calls' execserver, slot wait,
// exit code and error kind), an item keeps its latest 200, and they go with it on Delete.
import { expect } from "chai";
import type pg from "pg";
import { ErrorKind } from "../../gen/slotbroker/v1/broker_pb.js";
import { CompletionBatcher } from "../../src/dispatcher/queue/group-commit.js";
import { createDefaultActions, ItemControlStore, migrate, normalizeSubmit, QueueStore, type CallResult, type ClaimedItem } from "../../src/dispatcher/index.js";
import { Code } from "../../src/shared/errors.js";
import { createTestDatabase } from "../support/postgres.js";
import { closeAll, openPool, receiptFor } from "./support.js";

const lowest = -2_147_483_648;

describe("item timeline", () => {
  let url: string;
  let pool: pg.Pool;
  let queue: QueueStore;
  let control: ItemControlStore;

  before(async () => {
    url = await createTestDatabase("events");
    await migrate(url);
  });
  beforeEach(async () => {
    pool = openPool(url);
    queue = new QueueStore(pool);
    control = new ItemControlStore(pool);
    await pool.query("TRUNCATE queue_items, fylrs CASCADE");
    await queue.registerFylr({ id: "fylr-a", hostname: "h", pid: 1 });
    await queue.registerFylr({ id: "fylr-b", hostname: "h", pid: 2 });
  });
  afterEach(() => closeAll(pool));

  const submit = (maxAttempts = 3, calls = 1) =>
    queue.submit(
      normalizeSubmit({ calls: Array.from({ length: calls }, () => ({ service: "cat", args: [], env: {} })), maxAttempts }, createDefaultActions(), {
        maxInputBytes: 1024,
        defaultMaxAttempts: 3,
      }),
    );

  async function claimed(fylr = "fylr-a"): Promise<ClaimedItem> {
    const [item] = await queue.claim(fylr, "exec", lowest, 1);
    return item!;
  }

  function ran(exitCode: number, startedAt: Date, error = ErrorKind.UNSPECIFIED): CallResult {
    return {
      service: "cat",
      receipt: receiptFor({ exitCode, instanceId: "exec-1", durationMs: 1500, error, errorMessage: error ? "took too long" : "" }),
      timing: { slotWaitMs: 42, startedAt, endedAt: new Date(startedAt.getTime() + 1500) },
    };
  }

  it("records every step of a failed attempt, a rescue and a success, with the calls' details", async () => {
    const { item } = await submit();
    const first = await claimed("fylr-a");
    expect(await queue.markRunning(first)).to.equal(true);
    const t0 = new Date(Date.now() - 10_000);
    expect(await queue.failAttempt(first, [ran(3, t0, ErrorKind.TIMEOUT)], "calls[0] (cat): timed out", 0, false)).to.equal("queued");
    await claimed("fylr-a");
    await pool.query("UPDATE fylrs SET heartbeat_at = now() - interval '1 hour' WHERE id = 'fylr-a'");
    expect((await queue.reapStale(1000, "fylr-b")).requeued.map((r) => r.id)).to.deep.equal([item.id]);
    const third = await claimed("fylr-b");
    const completer = new CompletionBatcher(queue);
    expect(await completer.complete(third, [ran(0, new Date())], undefined)).to.equal(true);

    const history = await control.history(item.id);
    expect(history.dropped).to.equal(0);
    // In write order: the calls' times (t0 is 10 s back) put them first in time order.
    const events = [...history.events].sort((a, b) => a.n - b.n);
    expect(events.map((e) => [e.n, e.kind, e.fylr, e.attempt])).to.deep.equal([
      [1, "submitted", undefined, undefined],
      [2, "claimed", "fylr-a", 1],
      [3, "running", "fylr-a", 1],
      [4, "call-started", "fylr-a", 1],
      [5, "call-ended", "fylr-a", 1],
      [6, "requeued", "fylr-a", 1],
      [7, "claimed", "fylr-a", 2],
      [8, "requeued", "fylr-b", 2],
      [9, "claimed", "fylr-b", 3],
      [10, "call-started", "fylr-b", 3],
      [11, "call-ended", "fylr-b", 3],
      [12, "succeeded", "fylr-b", 3],
    ]);
    const [started, ended, requeued] = [events[3]!, events[4]!, events[5]!];
    expect(started).to.include({ execserver: "exec-1", service: "cat", slotWaitMs: 42 });
    expect(started.at.getTime()).to.equal(t0.getTime());
    expect(ended).to.include({ execserver: "exec-1", exitCode: 3, errorKind: "ERROR_KIND_TIMEOUT", durationMs: 1500, detail: "took too long" });
    expect(requeued.detail).to.equal("after a failed attempt: calls[0] (cat): timed out");
    expect(events[7]!.detail).to.equal("rescued: fylr fylr-a stopped heartbeating");
  });

  it("records cancels, retries, releases and a claim in the insert", async () => {
    const { item } = await submit(1);
    const held = await claimed();
    expect(await queue.release(held, 60_000)).to.equal(true);
    await control.cancel(item.id);
    await control.retry(item.id);
    const running = await claimed();
    await queue.markRunning(running);
    await control.cancel(item.id);
    expect(await queue.finishCancelled(running, [], "cancelled by request")).to.equal(true);
    const kinds = (await control.history(item.id)).events.map((e) => [e.kind, e.detail]);
    expect(kinds).to.deep.equal([
      ["submitted", undefined],
      ["claimed", undefined],
      ["requeued", "no slot in time; the attempt given back"],
      ["cancelled", "by request"],
      ["retried", undefined],
      ["claimed", undefined],
      ["running", undefined],
      ["cancel-requested", "by request"],
      ["cancelled", "cancelled by request"],
    ]);

    const direct = await queue.submit(normalizeSubmit({ calls: [{ service: "cat", args: [], env: {} }] }, createDefaultActions(), { maxInputBytes: 1024, defaultMaxAttempts: 3 }), "fylr-a");
    expect(direct.item.state).to.equal("claimed");
    expect((await control.history(direct.item.id)).events.map((e) => [e.kind, e.fylr])).to.deep.equal([
      ["submitted", undefined],
      ["claimed", "fylr-a"],
    ]);
  });

  it("keeps the latest 200 events of an item and says how many went before", async () => {
    const { item } = await submit(1);
    // 1 submitted + 120 × (claimed, requeued) = 241 events.
    for (let i = 0; i < 120; i++) expect(await queue.release(await claimed(), 0)).to.equal(true);
    const { events, dropped } = await control.history(item.id);
    expect(events).to.have.length(200);
    expect(dropped).to.equal(41);
    expect(Math.min(...events.map((e) => e.n))).to.equal(42);
    expect(events.find((e) => e.n === 241)).to.include({ kind: "requeued" });
    const { rows } = await pool.query<{ n: number }>("SELECT count(*)::int AS n FROM item_events WHERE item_id = $1", [item.id]);
    expect(rows[0]!.n).to.equal(200);
  });

  it("deletes the events with their item, and answers NOT_FOUND for an unknown one", async () => {
    const { item } = await submit();
    await control.cancel(item.id);
    expect((await control.history(item.id)).events).to.have.length(2);
    await control.delete(item.id);
    const { rows } = await pool.query<{ n: number }>("SELECT count(*)::int AS n FROM item_events WHERE item_id = $1", [item.id]);
    expect(rows[0]!.n).to.equal(0);
    const err = await control.history(item.id).catch((e: unknown) => e);
    expect(err).to.have.property("code", Code.NotFound);
    expect(await control.history("00000000-0000-0000-0000-000000000000").catch((e: unknown) => (e as Error).message)).to.match(/not found/);
  });

  it("reads a timeline on the primary key's index", async () => {
    const { rows } = await pool.query<{ "QUERY PLAN": string }>(
      "EXPLAIN SELECT * FROM item_events WHERE item_id = '00000000-0000-0000-0000-000000000000' ORDER BY n",
    );
    expect(rows.map((r) => r["QUERY PLAN"]).join("\n")).to.match(/Index Scan using item_events_pkey|Bitmap Index Scan on item_events_pkey/);
  });
});
