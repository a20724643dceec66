// The batched success writes (CompletionBatcher): a lone completion takes the single-row
// statement, completions of the same turn share one batch statement, and every entry keeps
// its own lease fence either way. Real Postgres.
import { create } from "@bufbuild/protobuf";
import { expect } from "chai";
import type pg from "pg";
import { ReceiptSchema } from "../../gen/slotbroker/v1/broker_pb.js";
import { CompletionBatcher } from "../../src/dispatcher/completion-batcher.js";
import { createDefaultActions, inlineOutput, migrate, normalizeSubmit, QueueStore, type ClaimedItem } from "../../src/dispatcher/index.js";
import { createTestDatabase } from "../support/postgres.js";
import { closeAll, openPool, receiptFor } from "./support.js";

const lowest = -2_147_483_648;

describe("completion batcher", () => {
  let url: string;
  let pool: pg.Pool;
  let store: QueueStore;
  let statements: string[];

  before(async () => {
    url = await createTestDatabase("completion_batcher");
    await migrate(url);
  });

  beforeEach(async () => {
    pool = openPool(url);
    store = new QueueStore(pool);
    await pool.query("TRUNCATE queue_items, fylrs CASCADE");
    await store.registerFylr({ id: "f", hostname: "h", pid: 1 });
    statements = [];
    const [one, many] = [store.complete.bind(store), store.completeMany.bind(store)];
    store.complete = (...args) => (statements.push("one"), one(...args));
    store.completeMany = (...args) => (statements.push(`many ${args[0].length}`), many(...args));
  });

  afterEach(() => closeAll(pool));

  async function claimed(n: number): Promise<ClaimedItem[]> {
    for (let i = 0; i < n; i++) {
      await store.submit(normalizeSubmit({ calls: [{ service: "cat", args: [], env: {} }] }, createDefaultActions(), { maxInputBytes: 1024, defaultMaxAttempts: 3 }));
    }
    return store.claim("f", "exec", lowest, n);
  }

  it("writes a lone completion with the single-row statement: output, receipts and the fence as a batch would", async () => {
    const batcher = new CompletionBatcher(store);
    const [item, stale] = await claimed(2);
    const receipt = receiptFor({ exitCode: 0, stdout: Buffer.from("ok") });
    expect(await batcher.complete(item!, [{ service: "cat", receipt }], inlineOutput(Buffer.from("ok")))).to.equal(true);
    expect(await batcher.complete({ ...stale!, lease: stale!.lease - 1 }, [], undefined), "an older lease").to.equal(false);
    expect(statements).to.deep.equal(["one", "one"]);
    const done = await store.get(item!.id);
    expect(done).to.deep.include({ state: "succeeded", output: Buffer.from("ok") });
    expect(done!.results[0]!.receipt.stdoutPrefix).to.deep.equal(new Uint8Array(Buffer.from("ok")));
    expect((await store.get(stale!.id))!.state).to.equal("claimed");
    // A written item is not written again.
    expect(await batcher.complete(item!, [], undefined)).to.equal(false);
  });

  it("writes completions of one turn in one batch statement, each with its own fence", async () => {
    const batcher = new CompletionBatcher(store);
    const [a, b, c] = await claimed(3);
    const written = await Promise.all([
      batcher.complete(a!, [], inlineOutput(Buffer.from("a"))),
      batcher.complete({ ...b!, claimedBy: "someone else" }, [], undefined),
      batcher.complete(c!, [], undefined),
    ]);
    expect(written).to.deep.equal([true, false, true]);
    expect(statements).to.deep.equal(["many 3"]);
    expect((await store.get(a!.id))!.output).to.deep.equal(Buffer.from("a"));
    expect((await store.get(b!.id))!.state).to.equal("claimed");
  });

  it("stores a receipt with text no column can hold through the single-row statement too", async () => {
    const hostile = "a\u0000b\ud800c";
    const batcher = new CompletionBatcher(store);
    const [item] = await claimed(1);
    const receipt = create(ReceiptSchema, { exitCode: 0, stderrLine: hostile, errorMessage: hostile });
    expect(await batcher.complete(item!, [{ service: "cat", receipt }], undefined)).to.equal(true);
    expect(statements).to.deep.equal(["one"]);
    expect((await store.get(item!.id))!.results[0]!.receipt.stderrLine).to.equal("a\ufffdb\ufffdc");
  });
});
