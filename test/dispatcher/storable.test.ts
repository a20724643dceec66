// A receipt is a peer's text: a NUL or a lone surrogate in its stderr line must not make
// the outcome unwritable (the item would stay claimed for as long as its fylr lives).
// Found by the fylr fuzzer (test/fuzz/fylr.test.ts). Real Postgres.
import { create } from "@bufbuild/protobuf";
import { expect } from "chai";
import type pg from "pg";
import { ReceiptSchema } from "../../gen/slotbroker/v1/broker_pb.js";
import { migrate, QueueStore } from "../../src/dispatcher/index.js";
import { storableJson, storableJsonText, storableText } from "../../src/dispatcher/queue/queue-store.js";
import { createTestDatabase } from "../support/postgres.js";
import { closeAll, openPool } from "./support.js";

const hostile = "a\u0000b\ud800c\udc00d 😀";

describe("outcomes with text no column can hold", () => {
  let pool: pg.Pool;
  before(async () => {
    const url = await createTestDatabase("storable");
    await migrate(url);
    pool = openPool(url, 2);
  });
  after(() => closeAll(pool));

  it("replaces NUL characters and lone surrogates, and keeps everything else", () => {
    expect(storableText(hostile)).to.equal("a\ufffdb\ufffdc\ufffdd 😀");
    expect(storableJson({ [hostile]: [hostile, 1, null, { x: hostile }] })).to.deep.equal({
      "a\ufffdb\ufffdc\ufffdd 😀": ["a\ufffdb\ufffdc\ufffdd 😀", 1, null, { x: "a\ufffdb\ufffdc\ufffdd 😀" }],
    });
  });

  it("writes the JSON text as it is when nothing needs replacing, else storableJson's", () => {
    const plain = { calls: [{ service: "s", receipt: { stderrLine: "ok 😀 \\u0000 as text", exitCode: 1 } }] };
    expect(storableJsonText(plain)).to.equal(JSON.stringify(plain));
    const bad = { [hostile]: [hostile, 1, null, { x: hostile }] };
    expect(storableJsonText(bad)).to.equal(JSON.stringify(storableJson(bad)));
    expect(storableJsonText(bad)).not.to.match(/\\u0000|\\ud[89a-f]/);
    expect(JSON.parse(storableJsonText({ a: "\udfff" }))).to.deep.equal({ a: "\ufffd" });
  });

  it("records a failed attempt and a completion whose receipts carry such text", async () => {
    const queue = new QueueStore(pool);
    await queue.registerFylr({ id: "f", hostname: "h", pid: 1 });
    const submit = (): Promise<string> => queue.submit({ kind: "exec", priority: 0, payload: { calls: [{ service: "s", args: [], env: {} }] }, maxAttempts: 3 } as never).then((r) => r.item.id);
    const [a, b] = [await submit(), await submit()];
    const [first, second] = await queue.claim("f", "exec", -(2 ** 31), 2);
    expect([first!.id, second!.id].sort()).to.deep.equal([a, b].sort());
    const receipt = create(ReceiptSchema, { exitCode: 3, stderrLine: hostile, errorMessage: hostile, instanceId: hostile });
    const fence = (i: typeof first): { id: string; claimedBy: string; lease: number } => ({ id: i!.id, claimedBy: "f", lease: i!.lease });
    expect(await queue.failAttempt(fence(first), [{ service: "s", receipt }], `exited with code 3: ${hostile}`, 0, false)).to.equal("queued");
    expect(await queue.completeMany([{ fence: fence(second), results: [{ service: "s", receipt }], output: undefined }])).to.deep.equal([true]);
    const failed = await queue.get(first!.id);
    expect(failed!.error).to.equal("exited with code 3: a\ufffdb\ufffdc\ufffdd 😀");
    expect(failed!.results[0]!.receipt.stderrLine).to.equal("a\ufffdb\ufffdc\ufffdd 😀");
    expect((await queue.get(second!.id))!.state).to.equal("succeeded");
  });
});
