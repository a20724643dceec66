// The batched success writes (CompletionBatcher): a lone completion takes the single-row
// statement, completions of the same turn share one batch statement, and every entry keeps
// its own lease fence either way; a batch that frees exec places carries the claim its
// rider books (group-commit.ts) in the same statement. Real Postgres.
import { create } from "@bufbuild/protobuf";
import { expect } from "chai";
import type pg from "pg";
import { ReceiptSchema } from "../../gen/slotbroker/v1/broker_pb.js";
import { CompletionBatcher, type Boarding } from "../../src/dispatcher/queue/group-commit.js";
import { createDefaultActions, inlineOutput, migrate, normalizeSubmit, QueueStore, type ClaimedItem } from "../../src/dispatcher/index.js";
import { createTestDatabase } from "../support/postgres.js";
import { closeAll, openPool, receiptFor } from "./support.js";

const lowest = -2_147_483_648;

describe("completion batcher", () => {
  let url: string;
  let pool: pg.Pool;
  let queue: QueueStore;
  let statements: string[];

  before(async () => {
    url = await createTestDatabase("completion_batcher");
    await migrate(url);
  });

  beforeEach(async () => {
    pool = openPool(url);
    queue = new QueueStore(pool);
    await pool.query("TRUNCATE queue_items, fylrs CASCADE");
    await queue.registerFylr({ id: "f", hostname: "h", pid: 1 });
    statements = [];
    const [one, many] = [queue.complete.bind(queue), queue.completeMany.bind(queue)];
    queue.complete = (...args) => (statements.push("one"), one(...args));
    queue.completeMany = (...args) => (statements.push(`many ${args[0].length}`), many(...args));
  });

  afterEach(() => closeAll(pool));

  async function claimed(n: number): Promise<ClaimedItem[]> {
    for (let i = 0; i < n; i++) {
      await queue.submit(normalizeSubmit({ calls: [{ service: "cat", args: [], env: {} }] }, createDefaultActions(), { maxInputBytes: 1024, defaultMaxAttempts: 3 }));
    }
    return queue.claim("f", "exec", lowest, n);
  }

  it("writes a lone completion with the single-row statement: output, receipts and the fence as a batch would", async () => {
    const batcher = new CompletionBatcher(queue);
    const [item, stale] = await claimed(2);
    const receipt = receiptFor({ exitCode: 0, stdout: Buffer.from("ok") });
    expect(await batcher.complete(item!, [{ service: "cat", receipt }], inlineOutput(Buffer.from("ok")))).to.equal(true);
    expect(await batcher.complete({ ...stale!, lease: stale!.lease - 1 }, [], undefined), "an older lease").to.equal(false);
    expect(statements).to.deep.equal(["one", "one"]);
    const done = await queue.get(item!.id);
    expect(done).to.deep.include({ state: "succeeded", output: Buffer.from("ok") });
    expect(done!.results[0]!.receipt.stdoutPrefix).to.deep.equal(new Uint8Array(Buffer.from("ok")));
    expect((await queue.get(stale!.id))!.state).to.equal("claimed");
    // A written item is not written again.
    expect(await batcher.complete(item!, [], undefined)).to.equal(false);
  });

  it("writes completions of one turn in one batch statement, each with its own fence", async () => {
    const batcher = new CompletionBatcher(queue);
    const [a, b, c] = await claimed(3);
    const written = await Promise.all([
      batcher.complete(a!, [], inlineOutput(Buffer.from("a"))),
      batcher.complete({ ...b!, claimedBy: "someone else" }, [], undefined),
      batcher.complete(c!, [], undefined),
    ]);
    expect(written).to.deep.equal([true, false, true]);
    expect(statements).to.deep.equal(["many 3"]);
    expect((await queue.get(a!.id))!.output).to.deep.equal(Buffer.from("a"));
    expect((await queue.get(b!.id))!.state).to.equal("claimed");
  });

  it("stores a receipt with text no column can hold through the single-row statement too", async () => {
    const hostile = "a\u0000b\ud800c";
    const batcher = new CompletionBatcher(queue);
    const [item] = await claimed(1);
    const receipt = create(ReceiptSchema, { exitCode: 0, stderrLine: hostile, errorMessage: hostile });
    expect(await batcher.complete(item!, [{ service: "cat", receipt }], undefined)).to.equal(true);
    expect(statements).to.deep.equal(["one"]);
    expect((await queue.get(item!.id))!.results[0]!.receipt.stderrLine).to.equal("a\ufffdb\ufffdc");
  });

  // A rider that books `limit` for fylr f and records what landed.
  function rider(batcher: CompletionBatcher, limit: number, fylrId = "f"): { freed: number[]; landed: ClaimedItem[][]; missed: number; freedAtLanding: number[] } {
    const seen = { freed: [] as number[], landed: [] as ClaimedItem[][], missed: 0, freedAtLanding: [] as number[] };
    placesFreed = 0;
    batcher.rider = {
      board: (freed): Boarding => {
        seen.freed.push(freed);
        return { fylrId, limit, landed: (items) => void (seen.landed.push([...items]), seen.freedAtLanding.push(placesFreed)), missed: () => void seen.missed++ };
      },
    };
    return seen;
  }

  // Places given up, counted; the rider records how many were given up when a claim landed.
  let placesFreed = 0;
  const free = (): void => void placesFreed++;

  it("claims along with a lone exec completion in one statement, in claim order, fence kept", async () => {
    const batcher = new CompletionBatcher(queue);
    const [item, stale] = await claimed(2);
    const queued = [];
    for (const priority of [0, 5, 0]) {
      const n = normalizeSubmit({ calls: [{ service: "cat", args: [], env: {} }], priority }, createDefaultActions(), { maxInputBytes: 1024, defaultMaxAttempts: 3 });
      queued.push((await queue.submit(n)).item);
    }
    const seen = rider(batcher, 2);
    expect(await batcher.complete(item!, [], inlineOutput(Buffer.from("ok")), free)).to.equal(true);
    expect(statements, "neither store statement").to.deep.equal([]);
    expect(seen.freed).to.deep.equal([1]);
    expect(seen.landed.map((items) => items.map((i) => i.id))).to.deep.equal([[queued[1]!.id, queued[0]!.id]]);
    expect(seen.landed[0]!.map((i) => [i.state, i.claimedBy, i.lease, i.attempts])).to.deep.equal([
      ["claimed", "f", 1, 1],
      ["claimed", "f", 1, 1],
    ]);
    expect(await queue.get(item!.id)).to.deep.include({ state: "succeeded", output: Buffer.from("ok") });
    expect((await queue.get(queued[2]!.id))!.state).to.equal("queued");
    // Fenced: not written, and the claim still went through (nothing left but one).
    expect(await batcher.complete({ ...stale!, lease: stale!.lease - 1 }, [], undefined, free)).to.equal(false);
    expect(seen.landed[1]!.map((i) => i.id)).to.deep.equal([queued[2]!.id]);
    expect((await queue.get(stale!.id))!.state).to.equal("claimed");
  });

  it("claims along with a batch of completions, each with its own fence; a local completion books nothing", async () => {
    const batcher = new CompletionBatcher(queue);
    const [a, b, c] = await claimed(3);
    const { item: next } = await queue.submit(normalizeSubmit({ calls: [{ service: "cat", args: [], env: {} }] }, createDefaultActions(), { maxInputBytes: 1024, defaultMaxAttempts: 3 }));
    const seen = rider(batcher, 3);
    const written = await Promise.all([
      batcher.complete(a!, [], inlineOutput(Buffer.from("a")), free),
      batcher.complete({ ...b!, claimedBy: "someone else" }, [], undefined, free),
      batcher.complete(c!, [], undefined, undefined),
    ]);
    expect(written).to.deep.equal([true, false, true]);
    expect(statements).to.deep.equal([]);
    expect(seen.freed).to.deep.equal([2]);
    expect(seen.freedAtLanding, "both exec places given up before the claimed item spawned").to.deep.equal([2]);
    expect(seen.landed.map((items) => items.map((i) => i.id))).to.deep.equal([[next.id]]);
    expect((await queue.get(a!.id))!.output).to.deep.equal(Buffer.from("a"));
    expect((await queue.get(b!.id))!.state).to.equal("claimed");
    expect((await queue.get(c!.id))!.state).to.equal("succeeded");
    // Only local completions: no booking asked for.
    const [d] = await claimed(1);
    expect(await batcher.complete(d!, [], undefined)).to.equal(true);
    expect(seen.freed).to.deep.equal([2]);
    expect(statements).to.deep.equal(["one"]);
  });

  it("claims nothing along for a fylr without a row, and notifies both changes", async () => {
    const batcher = new CompletionBatcher(queue);
    const [item] = await claimed(1);
    const { item: queued } = await queue.submit(normalizeSubmit({ calls: [{ service: "cat", args: [], env: {} }] }, createDefaultActions(), { maxInputBytes: 1024, defaultMaxAttempts: 3 }));
    const ghost = rider(batcher, 1, "gone");
    const listener = await pool.connect();
    const heard: string[] = [];
    listener.on("notification", (m) => heard.push(m.payload ?? ""));
    await listener.query("LISTEN slotbroker_queue");
    expect(await batcher.complete(item!, [], undefined, free)).to.equal(true);
    expect(ghost.landed).to.deep.equal([[]]);
    const seen = rider(batcher, 1);
    const [held] = await queue.claim("f", "exec", lowest, 1);
    expect(held!.id).to.equal(queued.id);
    const { item: last } = await queue.submit(normalizeSubmit({ calls: [{ service: "cat", args: [], env: {} }] }, createDefaultActions(), { maxInputBytes: 1024, defaultMaxAttempts: 3 }));
    heard.length = 0;
    expect(await batcher.complete(held!, [], undefined, free)).to.equal(true);
    expect(seen.landed.map((items) => items.map((i) => i.id))).to.deep.equal([[last.id]]);
    await new Promise((r) => setTimeout(r, 100));
    listener.release();
    expect(heard.join(" ")).to.include(held!.id).and.include(last.id);
  });

  it("claims local items along with local completions under the permits' rule, permits given back first", async () => {
    const batcher = new CompletionBatcher(queue);
    const local = (priority: number) =>
      normalizeSubmit({ local: { name: "count", params: {}, input: Buffer.alloc(0) }, priority }, createDefaultActions(), { maxInputBytes: 1024, defaultMaxAttempts: 3 });
    for (let i = 0; i < 2; i++) await queue.submit(local(0));
    const held = await queue.claimLocal("f", { total: 2, normal: 2, highPriority: 1 });
    const normal = [];
    for (let i = 0; i < 3; i++) normal.push((await queue.submit(local(0))).item.id);
    const high = (await queue.submit(local(4))).item.id;
    let permitsGiven = 0;
    const landed: ClaimedItem[][] = [];
    const atLanding: number[] = [];
    batcher.rider = {
      board: (freed, freedPermits): Boarding => {
        expect([freed, freedPermits]).to.deep.equal([0, 2]);
        // Three permits, two of them open to normal items: the high one takes one of those two.
        return { fylrId: "f", limit: 3, local: { normal: 2, highPriority: 1 }, landed: (items) => void (landed.push([...items]), atLanding.push(permitsGiven)), missed: () => undefined };
      },
    };
    const give = (): void => void permitsGiven++;
    const written = await Promise.all([
      batcher.complete(held[0]!, [], undefined, undefined, give),
      batcher.complete({ ...held[1]!, lease: held[1]!.lease + 1 }, [], undefined, undefined, give),
    ]);
    expect(written, "the fence holds").to.deep.equal([true, false]);
    expect(statements).to.deep.equal([]);
    expect(atLanding).to.deep.equal([2]);
    expect(landed.map((items) => items.map((i) => i.id))).to.deep.equal([[high, normal[0]]]);
    expect(landed[0]!.every((i) => i.state === "running" && i.claimedBy === "f" && i.lease === 1)).to.equal(true);
    expect((await queue.get(normal[1]!))!.state).to.equal("queued");
    const events = await pool.query<{ kind: string }>("SELECT kind FROM item_events WHERE item_id = $1 ORDER BY n", [high]);
    expect(events.rows.map((r) => r.kind)).to.deep.equal(["submitted", "claimed", "running"]);
  });

  it("writes the successes alone when the claim along fails for good", async () => {
    const batcher = new CompletionBatcher(queue);
    const [item] = await claimed(1);
    const seen = rider(batcher, -1); // LIMIT -1: refused by Postgres, not a transient error
    expect(await batcher.complete(item!, [], undefined, free)).to.equal(true);
    expect(seen.missed).to.equal(1);
    expect(seen.landed).to.deep.equal([]);
    expect(statements).to.deep.equal(["one"]);
    expect((await queue.get(item!.id))!.state).to.equal("succeeded");
  });
});
