import { expect } from "chai";
import type pg from "pg";
import {
  createDefaultActions,
  LocalPermits,
  migrate,
  normalizeSubmit,
  QueueStore,
  type ClaimedItem,
  type SubmitInput, inlineOutput } from "../../src/dispatcher/index.js";
import { createTestDatabase } from "../support/postgres.js";
import { closeAll, openPool, receiptFor } from "./support.js";

const actions = createDefaultActions();
const limits = { maxInputBytes: 1 << 20, defaultMaxAttempts: 3 };
const lowest = -2_147_483_648;

function exec(extra: Partial<SubmitInput> = {}): SubmitInput {
  return { calls: [{ service: "cat", args: [], env: {} }], ...extra };
}

describe("queue store", () => {
  let url: string;
  let pool: pg.Pool;
  let queue: QueueStore;

  before(async () => {
    url = await createTestDatabase("store");
    await migrate(url);
  });

  beforeEach(async () => {
    pool = openPool(url);
    queue = new QueueStore(pool);
    await pool.query("TRUNCATE queue_items, fylrs CASCADE");
    await queue.registerFylr({ id: "fylr-a", hostname: "h", pid: 1 });
    await queue.registerFylr({ id: "fylr-b", hostname: "h", pid: 2 });
  });

  afterEach(async () => {
    await closeAll(pool);
  });

  const submit = (input: SubmitInput) => queue.submit(normalizeSubmit(input, actions, limits));

  /** Makes a fylr's heartbeat look `ms` old. */
  const age = (fylr: string, ms: number) => pool.query("UPDATE fylrs SET heartbeat_at = now() - $2 * interval '1 millisecond' WHERE id = $1", [fylr, ms]);

  /** Seconds between start_after and updated_at, both the database's now() of the last write. */
  const delaySeconds = async (id: string): Promise<number> =>
    Number((await pool.query<{ d: string }>("SELECT extract(epoch FROM start_after - updated_at) AS d FROM queue_items WHERE id = $1", [id])).rows[0]!.d);

  it("stores calls with inline, URL and previous-stdout stdin, and local actions", async () => {
    const { item } = await submit({
      calls: [
        { service: "cat", args: ["-n"], env: { LANG: "C" }, timeoutMs: 1500, stdin: { kind: "data", data: Buffer.from([0, 1, 255]) } },
        { service: "wc", args: [], env: {}, stdin: { kind: "previous" } },
        { service: "cat", args: [], env: {}, stdin: { kind: "url", url: "http://127.0.0.1:1/x" } },
      ],
      priority: 7,
      maxAttempts: 5,
    });
    const got = await queue.get(item.id);
    expect(got).to.deep.include({ kind: "exec", priority: 7, state: "queued", attempts: 0, maxAttempts: 5, lease: 0 });
    expect(got!.calls[0]).to.deep.equal({ service: "cat", args: ["-n"], env: { LANG: "C" }, timeoutMs: 1500, stdin: { kind: "data", data: Buffer.from([0, 1, 255]) } });
    expect(got!.calls[1]!.stdin).to.deep.equal({ kind: "previous" });
    expect(got!.calls[2]!.stdin).to.deep.equal({ kind: "url", url: "http://127.0.0.1:1/x" });
    const local = (await submit({ local: { name: "checksum", params: { algorithm: "md5" }, input: Buffer.from("hi") } })).item;
    expect((await queue.get(local.id))!.local).to.deep.equal({ name: "checksum", params: { algorithm: "md5" }, input: Buffer.from("hi") });
    expect(await queue.get("00000000-0000-4000-8000-000000000000")).to.equal(undefined);
    await queue.get("not-a-uuid").then(
      () => expect.fail("should reject"),
      (err: Error) => expect(err.message).to.match(/id: not a UUID/),
    );
  });

  it("answers a submit with the item exactly as the database then reads it (the insert returns only what it decides)", async () => {
    const inputs: SubmitInput[] = [
      exec(),
      {
        calls: [
          { service: "cat", args: ["-n", "ü"], env: { LANG: "C", __proto__: "x" }, timeoutMs: 1500, stdin: { kind: "data", data: Buffer.from([0, 1, 255]) } },
          { service: "wc", args: [], env: {}, stdin: { kind: "previous" } },
        ],
        priority: -3,
        maxAttempts: 7,
        idempotencyKey: "k-1",
        startAfter: new Date(Date.now() + 60_000),
        traceparent: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        fairnessKey: "tenant-a",
        fairnessWeight: 3,
        fairnessLimit: 2,
      },
      { local: { name: "checksum", params: { algorithm: "md5" }, input: Buffer.from("hi") }, priority: 2 },
    ];
    for (const input of inputs) {
      const { item, created } = await submit(input);
      expect(created).to.equal(true);
      expect(item).to.deep.equal(await queue.get(item.id));
    }
    // Claimed in its insert (no queued item of its priority or higher is due).
    const claimed = await queue.submit(normalizeSubmit(exec({ priority: 1, fairnessKey: "t" }), actions, limits), "fylr-a");
    expect(claimed.item).to.deep.include({ state: "claimed", claimedBy: "fylr-a", lease: 1, attempts: 1 });
    expect(claimed.item).to.deep.equal(await queue.get(claimed.item.id));
  });

  it("returns the same item for a repeated idempotency key, also under concurrent submits", async () => {
    const results = await Promise.all(Array.from({ length: 12 }, () => submit(exec({ idempotencyKey: "order-42" }))));
    expect(new Set(results.map((r) => r.item.id)).size).to.equal(1);
    expect(results.filter((r) => r.created)).to.have.length(1);
    const again = await submit(exec({ idempotencyKey: "order-42", priority: 99 }));
    expect(again).to.deep.include({ created: false });
    expect(again.item.id).to.equal(results[0]!.item.id);
    expect(again.item.priority).to.equal(0);
    expect((await submit(exec({ idempotencyKey: "order-43" }))).created).to.equal(true);
  });

  it("claims in priority order, oldest first within a priority, and not before start_after", async () => {
    const ids: Record<string, string> = {};
    for (const [name, priority] of [["p0", 0], ["p5a", 5], ["m1", -1], ["p5b", 5], ["p10", 10]] as const) {
      ids[name] = (await submit(exec({ priority }))).item.id;
    }
    ids.later = (await submit(exec({ priority: 100, startAfter: new Date(Date.now() + 3_600_000) }))).item.id;
    ids.local = (await submit({ local: { name: "count", params: {}, input: Buffer.alloc(0) } })).item.id;
    const first = await queue.claim("fylr-a", "exec", lowest, 2);
    const rest = await queue.claim("fylr-b", "exec", lowest, 10);
    expect(first.map((i) => i.id)).to.deep.equal([ids.p10, ids.p5a]);
    expect(rest.map((i) => i.id)).to.deep.equal([ids.p5b, ids.p0, ids.m1]);
    expect(first.every((i) => i.claimedBy === "fylr-a" && i.lease === 1 && i.attempts === 1 && i.state === "claimed")).to.equal(true);
    expect((await queue.get(ids.later))!.state).to.equal("queued");
    await pool.query("UPDATE queue_items SET start_after = now() - interval '1 second' WHERE id = $1", [ids.later]);
    expect((await queue.claim("fylr-a", "exec", lowest, 10)).map((i) => i.id)).to.deep.equal([ids.later]);
    expect((await queue.claim("fylr-a", "local", 1, 10)).map((i) => i.id)).to.deep.equal([]);
    expect((await queue.claim("fylr-a", "local", lowest, 10)).map((i) => i.id)).to.deep.equal([ids.local]);
  });

  it("claims local items straight to running, keeping the reserve for high priority like LocalPermits", async () => {
    const local = (priority: number) => submit({ local: { name: "count", params: {}, input: Buffer.alloc(0) }, priority });
    const permits = new LocalPermits(4); // one permit reserved for priority >= 1
    for (let i = 0; i < 5; i++) await local(0);
    const high = [(await local(3)).item.id, (await local(1)).item.id];
    const limits = () => ({ total: permits.available(1), normal: permits.available(0), highPriority: 1 });
    const first = await queue.claimLocal("fylr-a", limits());
    // Both high-priority items, and normal ones only up to the normal permits left after them.
    expect(first.map((i) => i.priority)).to.deep.equal([3, 1, 0]);
    expect(first.slice(0, 2).map((i) => i.id)).to.deep.equal(high);
    expect(first.every((i) => i.state === "running" && i.lease === 1)).to.equal(true);
    for (const item of first) expect(permits.tryReserve(item.priority), `permit for priority ${item.priority}`).to.not.equal(undefined);
    expect(await queue.claimLocal("fylr-a", limits())).to.deep.equal([]); // normal permits used up; the last is reserved
    expect((await queue.claimLocal("fylr-b", { total: 4, normal: 3, highPriority: 1 })).map((i) => i.priority)).to.deep.equal([0, 0, 0]);
    expect((await queue.claimLocal("fylr-b", { total: 4, normal: 0, highPriority: 1 }))).to.deep.equal([]);
    await local(5);
    expect((await queue.claimLocal("fylr-b", { total: 1, normal: 0, highPriority: 1 })).map((i) => i.priority)).to.deep.equal([5]);
  });

  it("claims exactly the total asked for locally, though its candidates' limit rounds up", async () => {
    const local = (priority: number) => submit({ local: { name: "count", params: {}, input: Buffer.alloc(0) }, priority });
    const normal = [];
    for (let i = 0; i < 5; i++) normal.push((await local(0)).item.id);
    const high = (await local(2)).item.id;
    // 3 rounds up to 4 candidates: the high one and three normal ones; only the first 3 are taken.
    const got = await queue.claimLocal("fylr-a", { total: 3, normal: 3, highPriority: 1 });
    expect(got.map((i) => i.id)).to.deep.equal([high, normal[0], normal[1]]);
    const rest = await queue.claimLocal("fylr-b", { total: 5, normal: 5, highPriority: 1 });
    expect(rest.map((i) => i.id)).to.deep.equal(normal.slice(2));
  });

  it("counts the queued items ahead of an item in claim order", async () => {
    const a = (await submit(exec({ priority: 1 }))).item.id;
    const b = (await submit(exec({ priority: 1 }))).item.id;
    const c = (await submit(exec({ priority: 0 }))).item.id;
    await submit(exec({ priority: 3 }));
    await submit(exec({ priority: 3, startAfter: new Date(Date.now() + 3_600_000) })); // not eligible before c
    await submit({ local: { name: "count", params: {}, input: Buffer.alloc(0) }, priority: 9 }); // other kind
    expect((await queue.position(a))!.aheadInQueue).to.equal(1);
    expect((await queue.position(b))!.aheadInQueue).to.equal(2);
    expect((await queue.position(c))!.aheadInQueue).to.equal(3);
    await queue.claim("fylr-a", "exec", lowest, 1);
    expect(await queue.position(c)).to.deep.equal({ state: "queued", kind: "exec", aheadInQueue: 2 });
    const claimed = await queue.position((await queue.claim("fylr-a", "exec", 1, 1))[0]!.id);
    expect(claimed).to.deep.equal({ state: "claimed", kind: "exec", aheadInQueue: 0 });
  });

  it("marks a batch running with a fence per entry, sending one change notification for the batch", async () => {
    for (let i = 0; i < 3; i++) await submit(exec());
    const [ca, cb, cc] = await queue.claim("fylr-a", "exec", lowest, 3);
    const listener = await pool.connect();
    const notes: string[] = [];
    try {
      listener.on("notification", (n) => notes.push(n.payload ?? ""));
      await listener.query("LISTEN slotbroker_queue");
      const written = await queue.markRunningMany([ca!, { ...cb!, lease: cb!.lease - 1 }, cc!, { ...ca!, claimedBy: "fylr-b" }]);
      expect(written).to.deep.equal([true, false, true, false]);
      await listener.query("SELECT 1");
      expect(notes).to.have.length(1);
      expect(notes[0]!.startsWith("changed ")).to.equal(true);
      expect(notes[0]!.slice("changed ".length).split(",").sort()).to.deep.equal([ca!.id, cc!.id].sort());
    } finally {
      await listener.query("UNLISTEN *");
      listener.release();
    }
    expect((await queue.get(ca!.id))!.state).to.equal("running");
    expect((await queue.get(cb!.id))!.state).to.equal("claimed");
    expect((await queue.get(cc!.id))!.state).to.equal("running");
    expect(await queue.markRunningMany([ca!])).to.deep.equal([false]);
  });

  it("completes a batch with a fence per entry", async () => {
    const a = (await submit(exec())).item.id;
    const b = (await submit(exec())).item.id;
    const [ca, cb] = await queue.claim("fylr-a", "exec", lowest, 2);
    const receipt = receiptFor({ exitCode: 0, stdout: Buffer.from([1, 2]) });
    const written = await queue.completeMany([
      { fence: ca!, results: [{ service: "cat", receipt }], output: inlineOutput(Buffer.from([1, 2])) },
      { fence: { ...cb!, lease: cb!.lease - 1 }, results: [], output: inlineOutput(Buffer.from("stale")) },
      { fence: cb!, results: [], output: undefined },
    ]);
    expect(written).to.deep.equal([true, false, true]);
    const [ia, ib] = [await queue.get(a), await queue.get(b)];
    expect(ia).to.deep.include({ state: "succeeded", output: Buffer.from([1, 2]) });
    expect(ia!.results[0]!.receipt.stdoutPrefix).to.deep.equal(new Uint8Array([1, 2]));
    expect(ib).to.deep.include({ state: "succeeded", output: undefined });
  });

  it("refuses a late completion with a stale lease after a survivor requeued the claim", async () => {
    const { item } = await submit(exec());
    const [old] = await queue.claim("fylr-a", "exec", lowest, 1);
    expect(old!.lease).to.equal(1);
    await age("fylr-a", 60_000);
    const reaped = await queue.reapStale(15_000, "fylr-b");
    expect(reaped.deadFylrs).to.deep.equal(["fylr-a"]);
    expect(reaped.requeued).to.deep.equal([{ id: item.id, claimedBy: "fylr-a" }]);
    const [fresh] = await queue.claim("fylr-b", "exec", lowest, 1);
    expect(fresh).to.deep.include({ id: item.id, lease: 2, attempts: 2, claimedBy: "fylr-b" });
    const receipt = receiptFor({ exitCode: 0, stdout: Buffer.from("late") });
    expect(await queue.markRunning(old!)).to.equal(false);
    expect(await queue.complete(old!, [{ service: "cat", receipt }], inlineOutput(Buffer.from("late")))).to.equal(false);
    expect(await queue.failAttempt(old!, [], "late", 0, false)).to.equal(undefined);
    expect(await queue.release(old!, 0)).to.equal(false);
    expect(await queue.markRunning(fresh!)).to.equal(true);
    expect(await queue.complete(fresh!, [{ service: "cat", receipt: receiptFor({ exitCode: 0, stdout: Buffer.from("ok") }) }], inlineOutput(Buffer.from("ok")))).to.equal(true);
    const done = await queue.get(item.id);
    expect(done).to.deep.include({ state: "succeeded", claimedBy: "fylr-b" });
    expect(done!.output).to.deep.equal(Buffer.from("ok"));
    expect(done!.results[0]!.receipt.stdoutPrefix).to.deep.equal(new Uint8Array(Buffer.from("ok")));
    expect(done!.finishedAt).to.be.instanceOf(Date);
  });

  it("requeues each orphan exactly once when several survivors sweep at the same time", async () => {
    for (let i = 0; i < 60; i++) await submit(exec());
    await queue.claim("fylr-a", "exec", lowest, 60);
    await age("fylr-a", 60_000);
    const survivors = ["s1", "s2", "s3", "s4", "s5"];
    for (const s of survivors) await queue.registerFylr({ id: s, hostname: "h", pid: 3 });
    const pools = survivors.map(() => openPool(url, 2));
    try {
      const results = await Promise.all(pools.map((p, i) => new QueueStore(p).reapStale(15_000, survivors[i]!)));
      const requeued = results.flatMap((r) => r.requeued.map((o) => o.id));
      expect(requeued).to.have.length(60);
      expect(new Set(requeued).size).to.equal(60);
      expect(results.flatMap((r) => r.deadFylrs)).to.deep.equal(["fylr-a"]);
      const states = await pool.query<{ state: string; n: number }>("SELECT state, count(*)::int AS n FROM queue_items GROUP BY state");
      expect(states.rows).to.deep.equal([{ state: "queued", n: 60 }]);
    } finally {
      await closeAll(...pools);
    }
  });

  it("does not touch the claims of fylrs with a fresh heartbeat, and fails an orphan on its last attempt", async () => {
    const keep = (await submit(exec())).item.id;
    await queue.claim("fylr-b", "exec", lowest, 1);
    const last = (await submit(exec({ maxAttempts: 1 }))).item.id;
    await queue.claim("fylr-a", "exec", lowest, 1);
    await age("fylr-a", 20_000);
    const reaped = await queue.reapStale(15_000, "fylr-b");
    expect(reaped.requeued).to.deep.equal([]);
    expect(reaped.failed).to.deep.equal([{ id: last, claimedBy: "fylr-a" }]);
    expect((await queue.get(keep))!.state).to.equal("claimed");
    const failed = await queue.get(last);
    expect(failed).to.deep.include({ state: "failed", attempts: 1 });
    expect(failed!.error).to.match(/fylr fylr-a stopped heartbeating during the last attempt/);
    // A claim whose owner has no row at all (stopped, or removed earlier) is an orphan too.
    await queue.deregisterFylr("fylr-b");
    await queue.registerFylr({ id: "fylr-c", hostname: "h", pid: 4 });
    expect((await queue.reapStale(15_000, "fylr-c")).requeued.map((o) => o.id)).to.deep.equal([keep]);
  });

  it("gives the attempt back and moves start_after out on no slot", async () => {
    const { item } = await submit(exec());
    const [claimed] = await queue.claim("fylr-a", "exec", lowest, 1);
    expect(claimed!.attempts).to.equal(1);
    expect(await queue.release(claimed!, 60_000)).to.equal(true);
    const back = await queue.get(item.id);
    expect(back).to.deep.include({ state: "queued", attempts: 0, claimedBy: undefined, lease: 1 });
    expect(await delaySeconds(item.id)).to.equal(60);
    expect(await queue.claim("fylr-a", "exec", lowest, 1)).to.deep.equal([]);
  });

  it("retries a failed attempt after the backoff and fails it with its receipt after the last", async () => {
    const { item } = await submit(exec({ maxAttempts: 2 }));
    const receipt = receiptFor({ exitCode: 3, stderrLine: "boom" });
    const [first] = await queue.claim("fylr-a", "exec", lowest, 1);
    expect(await queue.failAttempt(first!, [{ service: "cat", receipt }], "exited with code 3: boom", 2000, false)).to.equal("queued");
    expect(await delaySeconds(item.id)).to.equal(2);
    expect((await queue.get(item.id))!.finishedAt).to.equal(undefined);
    await pool.query("UPDATE queue_items SET start_after = now() WHERE id = $1", [item.id]);
    const [second] = await queue.claim("fylr-a", "exec", lowest, 1);
    expect(await queue.failAttempt(second!, [{ service: "cat", receipt }], "exited with code 3: boom", 4000, false)).to.equal("failed");
    const failed = await queue.get(item.id);
    expect(failed).to.deep.include({ state: "failed", attempts: 2, error: "exited with code 3: boom" });
    expect(failed!.results[0]!.receipt.exitCode).to.equal(3);
    expect(failed!.finishedAt).to.be.instanceOf(Date);
  });

  it("fails at once when the failure is permanent", async () => {
    const { item } = await submit(exec({ maxAttempts: 5 }));
    const [claimed] = await queue.claim("fylr-a", "exec", lowest, 1);
    expect(await queue.failAttempt(claimed as ClaimedItem, [], "too big", 1000, true)).to.equal("failed");
    expect((await queue.get(item.id))!.attempts).to.equal(1);
  });

  it("reports a heartbeat for a removed fylr row as not alive", async () => {
    expect(await queue.heartbeat("fylr-a")).to.equal(true);
    await queue.deregisterFylr("fylr-a");
    expect(await queue.heartbeat("fylr-a")).to.equal(false);
  });
});
