import { create, fromBinary, fromJson, toBinary, toJson } from "@bufbuild/protobuf";
import { expect } from "chai";
import { ExecCallSchema, ItemKind, ItemSchema, ItemState, SubmitRequestSchema, StatsResponseSchema } from "../../gen/slotbroker/v1/queue_pb.js";
import { createDefaultActions, itemToBinary, itemToProto, normalizeSubmit, statsToProto, submitInputFromProto, submitRequestFromBinary, type QueueItem } from "../../src/dispatcher/index.js";
import { ReceiptSchema } from "../../gen/slotbroker/v1/broker_pb.js";
import { receiptFor } from "./support.js";

describe("dispatcher ↔ queue.proto", () => {
  it("reads a curl-style JSON SubmitRequest into a valid submit", () => {
    const req = fromJson(SubmitRequestSchema, {
      calls: [
        { service: "cat", stdinData: Buffer.from("hello").toString("base64"), timeout: "2.5s", env: { LANG: "C" } },
        { service: "sha256sum", stdinFromPrevious: true, args: ["-b"] },
      ],
      priority: 4,
      idempotencyKey: "k1",
    });
    const input = submitInputFromProto(req);
    expect(input.calls).to.deep.equal([
      { service: "cat", args: [], env: { LANG: "C" }, timeoutMs: 2500, stdin: { kind: "data", data: Buffer.from("hello") } },
      { service: "sha256sum", args: ["-b"], env: {}, timeoutMs: undefined, stdin: { kind: "previous" } },
    ]);
    expect(input).to.include({ priority: 4, idempotencyKey: "k1", maxAttempts: undefined, local: undefined });
    const n = normalizeSubmit(input, createDefaultActions(), { maxInputBytes: 100, defaultMaxAttempts: 3 });
    expect(n).to.include({ kind: "exec", priority: 4, maxAttempts: 3 });
    const local = submitInputFromProto(create(SubmitRequestSchema, { local: { name: "checksum", params: { algorithm: "md5" }, input: new Uint8Array([1]) } }));
    expect(local.local).to.deep.equal({ name: "checksum", params: { algorithm: "md5" }, input: Buffer.from([1]) });
    expect(local.calls).to.deep.equal([]);
  });

  it("writes a stored item as an Item that serialises to JSON", () => {
    const now = new Date("2026-01-02T03:04:05.678Z");
    const item: QueueItem = {
      id: "6f0a2d1e-9c1b-4a55-8d2e-0f3c4b5a6d7e",
      kind: "exec",
      priority: 2,
      state: "succeeded",
      calls: [{ service: "cat", args: [], env: {}, stdin: { kind: "url", url: "http://x/in" }, timeoutMs: 1000 }],
      local: undefined,
      claimedBy: "fylr-1",
      lease: 3,
      attempts: 2,
      maxAttempts: 3,
      startAfter: now,
      createdAt: now,
      claimedAt: now,
      updatedAt: now,
      finishedAt: now,
      results: [{ service: "cat", receipt: receiptFor({ exitCode: 0, stdout: Buffer.from("ok") }) }],
      output: Buffer.from("ok"),
      outputBlob: undefined,
      outputSize: 2,
      outputSha256: "2689367b205c16ce32ed4200942b8b8b1e262dfc70d9bc9fbc77c49699a4f1df",
      error: undefined,
      idempotencyKey: undefined,
      cancelRequestedAt: undefined,
      fairnessKey: "",
      fairnessWeight: 1,
      fairnessLimit: undefined,
    };
    const proto = itemToProto(item);
    expect(proto).to.deep.include({ kind: ItemKind.EXEC, state: ItemState.SUCCEEDED, attempts: 2, claimedBy: "" });
    const json = toJson(ItemSchema, proto) as Record<string, unknown>;
    expect(json).to.deep.include({ id: item.id, priority: 2, output: Buffer.from("ok").toString("base64"), createdAt: "2026-01-02T03:04:05.678Z" });
    expect((json.calls as object[])[0]).to.deep.include({ stdinUrl: "http://x/in", timeout: "1s" });
    const stats = statsToProto({
      fylrId: "f",
      state: "running",
      execHeld: 3,
      execAdmission: 10,
      shares: [{ instanceId: "i", address: "a:1", capacity: 40, clients: 5, share: 10 }],
      localRunning: 1,
      localCapacity: 2,
      localReservedForHigh: 1,
      counters: { claimed: 5, claimedDirectly: 0, succeeded: 4, failed: 1, requeued: 2, orphansRescued: 0, fenced: 0, cancelled: 0, finishedDeleted: 0, passes: 9 },
    });
    expect(toJson(StatsResponseSchema, stats)).to.deep.include({ execAdmission: 10, claimedTotal: "5", shares: [{ instanceId: "i", address: "a:1", capacity: 40, clients: 5, share: 10 }] });
  });

  it("the hand-written codecs know every field of the messages they write and read", () => {
    // itemToBinary, submitRequestFromBinary and receiptJson (payload.ts) handle these fields
    // themselves. A field added to the proto would be dropped without a word: add it to them
    // (or have them leave such messages to protobuf-es), then here.
    const numbers = (schema: { fields: readonly { number: number }[] }): number[] => schema.fields.map((f) => f.number).sort((a, b) => a - b);
    expect(numbers(ItemSchema), "Item").to.deep.equal([1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 35]);
    expect(numbers(ExecCallSchema), "ExecCall").to.deep.equal([1, 2, 3, 4, 5, 6, 7, 8]);
    expect(numbers(SubmitRequestSchema), "SubmitRequest").to.deep.equal([1, 2, 3, 4, 5, 6, 7, 8, 9]);
    expect(numbers(ReceiptSchema), "Receipt").to.deep.equal([1, 2, 3, 4, 5, 6, 7, 8, 9, 10]);
  });

  it("writes an item without results as the same bytes as protobuf-es does", () => {
    const base: QueueItem = {
      id: "6f0a2d1e-9c1b-4a55-8d2e-0f3c4b5a6d7e",
      kind: "exec",
      priority: 0,
      state: "queued",
      calls: [{ service: "true", args: [], env: {} }],
      local: undefined,
      claimedBy: undefined,
      lease: 0,
      attempts: 0,
      maxAttempts: 3,
      startAfter: new Date("2026-01-02T03:04:05.678Z"),
      createdAt: new Date("2026-01-02T03:04:05.000Z"),
      claimedAt: undefined,
      updatedAt: new Date(),
      finishedAt: undefined,
      results: [],
      output: undefined,
      outputBlob: undefined,
      outputSize: undefined,
      outputSha256: undefined,
      error: undefined,
      idempotencyKey: undefined,
      cancelRequestedAt: undefined,
      fairnessKey: "",
      fairnessWeight: 1,
      fairnessLimit: undefined,
    };
    const variants: QueueItem[] = [
      base,
      { ...base, state: "claimed", claimedBy: "fylr-ä", lease: 1, attempts: 1, priority: -3, fairnessKey: "tenant-ü", fairnessWeight: 7, fairnessLimit: 2 },
      { ...base, state: "running", claimedBy: "f", priority: 2_000_000_000, idempotencyKey: "k".repeat(200), traceparent: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01" },
      {
        ...base,
        calls: [
          { service: "cat", args: ["-b", "", "x".repeat(300)], env: { LANG: "C", EMPTY: "", "Ü": "ö".repeat(100) }, stdin: { kind: "data", data: Buffer.from("hello") }, timeoutMs: 2500 },
          { service: "sha256sum", args: [], env: {}, stdin: { kind: "previous" }, timeoutMs: 0 },
          { service: "u", args: [], env: {}, stdin: { kind: "url", url: "" }, timeoutMs: 3_000_000_000 },
          { service: "v", args: [], env: {}, stdin: { kind: "upload", id: "up-1" }, timeoutMs: 999 },
          { service: "", args: [], env: {}, stdin: { kind: "data", data: Buffer.alloc(0) } },
        ],
      },
      { ...base, calls: [], state: "failed", finishedAt: new Date(0), error: "boom", output: Buffer.from("out"), outputSize: 1 << 40, outputSha256: "ab", outputBlob: "blob" },
      { ...base, cancelRequestedAt: new Date("1969-12-31T23:59:59.001Z"), startAfter: new Date(-1500) },
    ];
    for (const item of variants) {
      for (const empty of [false, true]) {
        const proto = itemToProto(item);
        if (empty) for (const call of proto.calls) if (call.stdin.case === "stdinData") call.stdin.value = new Uint8Array(0);
        expect(itemToBinary(item, empty), JSON.stringify(item)).to.deep.equal(Buffer.from(toBinary(ItemSchema, proto)));
      }
    }
    expect(itemToBinary({ ...base, results: [{ service: "cat", receipt: receiptFor({ exitCode: 0 }) }] }, true)).to.equal(undefined);
    expect(itemToBinary({ ...base, calls: [{ service: "true", args: [], env: {}, timeoutMs: 1.5 }] }, true)).to.equal(undefined);
  });

  it("reads a binary SubmitRequest by hand exactly as protobuf-es does, or leaves it to protobuf-es", () => {
    const requests = [
      create(SubmitRequestSchema, {}),
      create(SubmitRequestSchema, { calls: [{ service: "true" }] }),
      create(SubmitRequestSchema, {
        calls: [
          { service: "cat", args: ["-b", "", "ü"], env: { LANG: "C", "": "", Ä: "ö" }, stdin: { case: "stdinData", value: new Uint8Array([1, 2, 3]) }, timeout: { seconds: 2n, nanos: 500_000_000 } },
          { service: "sha256sum", stdin: { case: "stdinFromPrevious", value: true } },
          { service: "u", stdin: { case: "stdinUrl", value: "http://x/in" } },
          { service: "v", stdin: { case: "stdinUpload", value: "up-1" }, timeout: { seconds: -1n, nanos: -5 } },
        ],
        priority: -7,
        startAfter: { seconds: 1_800_000_000n, nanos: 123 },
        idempotencyKey: "key",
        maxAttempts: 4,
        fairnessKey: "tenant",
        fairnessWeight: 3,
        fairnessLimit: 2,
      }),
    ];
    for (const req of requests) {
      const bytes = toBinary(SubmitRequestSchema, req);
      expect(submitRequestFromBinary(bytes)).to.deep.equal(fromBinary(SubmitRequestSchema, bytes));
    }
    // A local action, an unknown field: left to protobuf-es.
    expect(submitRequestFromBinary(toBinary(SubmitRequestSchema, create(SubmitRequestSchema, { local: { name: "x" } })))).to.equal(undefined);
    expect(submitRequestFromBinary(new Uint8Array([0x50, 1]))).to.equal(undefined);
    // Corrupted bytes: either both decoders agree or the hand one gives up.
    const base = toBinary(SubmitRequestSchema, requests[2]!);
    let seed = 7;
    const random = (n: number): number => ((seed = (seed * 1103515245 + 12345) % 2 ** 31) % n);
    for (let i = 0; i < 2000; i++) {
      const bytes = base.slice(0, random(base.length + 1));
      for (let k = random(3); k > 0; k--) if (bytes.length > 0) bytes[random(bytes.length)] = random(256);
      const hand = submitRequestFromBinary(bytes);
      if (hand === undefined) continue;
      expect(hand).to.deep.equal(fromBinary(SubmitRequestSchema, bytes));
    }
  });
});
