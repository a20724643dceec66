import { expect } from "chai";
import { compileDispatcherConfig, createDefaultActions, normalizeSubmit, type ExecCallSpec } from "../../src/dispatcher/index.js";
import { create, toJson } from "@bufbuild/protobuf";
import { ErrorKind, ReceiptSchema } from "../../gen/slotbroker/v1/broker_pb.js";
import { decodePayload, insertedItem, itemFromRow, receiptJson } from "../../src/dispatcher/queue/payload.js";
import type { SlotbrokerError } from "../../src/shared/errors.js";
import { Code } from "../../src/shared/errors.js";

const limits = { maxInputBytes: 1 << 20, defaultMaxAttempts: 3 };

// What the payload column gives back: the stored JSON, parsed again.
function stored(calls: ExecCallSpec[]): unknown {
  return JSON.parse(JSON.stringify(normalizeSubmit({ calls }, createDefaultActions(), limits).payload));
}

function unreadable(raw: unknown): SlotbrokerError {
  try {
    decodePayload("item-1", raw);
  } catch (err) {
    return err as SlotbrokerError;
  }
  return expect.fail("expected the payload to be refused");
}

describe("dispatcher payload column", () => {
  it("reads back every kind of call as it was submitted", () => {
    const calls: ExecCallSpec[] = [
      { service: "true", args: [], env: {} },
      { service: "sh", args: ["-c", "echo ü"], env: { A: "1", B_2: "" }, timeoutMs: 1500, stdin: { kind: "data", data: Buffer.from("hello") } },
      { service: "cat", args: [], env: {}, stdin: { kind: "previous" } },
    ];
    expect(decodePayload("x", stored(calls))).to.deep.equal({ calls, local: undefined });
    // Valid base64 that Buffer would not write ("R" carries stray low bits) still reads.
    const loose = decodePayload("x", { calls: [{ service: "cat", args: [], env: {}, stdin: { data: "QR==" } }] });
    expect(loose.calls[0]!.stdin).to.deep.equal({ kind: "data", data: Buffer.from("A") });
    const url: ExecCallSpec[] = [{ service: "cat", args: [], env: {}, stdin: { kind: "url", url: "https://example.com/in" } }];
    expect(decodePayload("x", stored(url))).to.deep.equal({ calls: url, local: undefined });
    const upload: ExecCallSpec[] = [{ service: "cat", args: [], env: {}, stdin: { kind: "upload", id: "3f2504e0-4f89-41d3-9a0c-0305e82c3301" } }];
    expect(decodePayload("x", stored(upload))).to.deep.equal({ calls: upload, local: undefined });
  });

  it("reads back random calls exactly", () => {
    const pick = (n: number): number => Math.floor(Math.random() * n);
    const text = (): string => String.fromCharCode(...Array.from({ length: pick(12) }, () => 32 + pick(0x3000)));
    for (let i = 0; i < 300; i++) {
      const calls: ExecCallSpec[] = Array.from({ length: 1 + pick(4) }, (_, k) => ({
        service: `s${pick(9)}`,
        args: Array.from({ length: pick(5) }, text),
        env: Object.fromEntries(Array.from({ length: pick(4) }, (_, j) => [`V${j}_${pick(99)}`, text()])),
        ...(pick(2) ? { timeoutMs: 1 + pick(100_000) } : {}),
        ...(pick(3) === 0 ? { stdin: { kind: "data" as const, data: Buffer.from(text()) } } : k > 0 && pick(3) === 0 ? { stdin: { kind: "previous" as const } } : {}),
      }));
      expect(decodePayload("x", stored(calls))).to.deep.equal({ calls, local: undefined });
    }
  });

  it("refuses what it cannot read with DATA_LOSS naming the item", () => {
    const good = { service: "true", args: [], env: {} };
    const bad: unknown[] = [
      null,
      [],
      { calls: [good], extra: 1 },
      { calls: [{ ...good, extra: 1 }] },
      { calls: [{ ...good, args: [1] }] },
      { calls: [{ ...good, env: { A: 1 } }] },
      { calls: [{ ...good, env: [] }] },
      { calls: [{ ...good, timeoutMs: "5" }] },
      { calls: [{ ...good, stdin: { data: "not base64!" } }] },
      { calls: [{ ...good, stdin: { upload: "not-a-uuid" } }] },
      { calls: [{ ...good, stdin: { previous: false } }] },
      { calls: [{ service: 5, args: [], env: {} }] },
    ];
    for (const raw of bad) {
      const err = unreadable(raw);
      expect(err.code, JSON.stringify(raw)).to.equal(Code.DataLoss);
      expect(err.message).to.match(/^queue item item-1: unreadable payload: \S/);
    }
  });

  it("reads a local action's payload", () => {
    const local = { name: "count", params: { a: "b" }, input: Buffer.from("in").toString("base64") };
    expect(decodePayload("x", { local })).to.deep.equal({ calls: [], local: { name: "count", params: { a: "b" }, input: Buffer.from("in") } });
  });
});

describe("stdin_url under dispatcher.stdinUrlPrefixes", () => {
  const prefixes = compileDispatcherConfig({ stdinUrlPrefixes: ["HTTPS://Files.Example.com:443/pub/"] }).stdinUrlPrefixes;
  const refusal = (url: string): string | undefined => {
    try {
      normalizeSubmit({ calls: [{ service: "cat", args: [], env: {}, stdin: { kind: "url", url } }] }, createDefaultActions(), { ...limits, stdinUrlPrefixes: prefixes });
    } catch (err) {
      expect((err as SlotbrokerError).code).to.equal(Code.InvalidArgument);
      return (err as Error).message;
    }
    return undefined;
  };

  it("compares the parsed URL with the parsed prefix", () => {
    expect(prefixes).to.deep.equal(["https://files.example.com/pub/"]);
    for (const ok of ["https://files.example.com/pub/a.txt", "https://FILES.example.com/pub/dir/a%20b.txt", "https://files.example.com/pub/a%2etxt", "https://files.example.com/pub/x?y=../../z"]) {
      expect(refusal(ok), ok).to.equal(undefined);
    }
  });

  it("refuses hostile paths that would leave the prefix on a server that decodes them", () => {
    const hostile: [string, RegExp][] = [
      ["https://files.example.com/pub/..%2fsecret", /hides a '\/' or '\\' in a percent-escape/],
      ["https://files.example.com/pub/..%2Fsecret", /hides a '\/'/],
      ["https://files.example.com/pub/%2e%2e%2fsecret", /hides a '\/'/],
      ["https://files.example.com/pub/..%5csecret", /hides a '\/' or '\\'/],
      ["https://files.example.com/pub/%252e%252e/secret", /percent-encoded twice/],
      ["https://files.example.com/pub/%zz", /malformed percent-escape/],
      ["https://files.example.com/pub/..;/secret", /dot segment hidden/],
      ["https://files.example.com/pub/a%00.txt", /encoded NUL/],
      // Resolved by the parser, then plainly outside.
      ["https://files.example.com/pub/%2e%2e/secret", /not under an allowed prefix/],
      ["https://files.example.com/pub/../secret", /not under an allowed prefix/],
      ["https://files.example.com/pub\\..\\secret", /not under an allowed prefix/],
      ["https://files.example.com.evil.com/pub/a", /not under an allowed prefix/],
      ["https://files.example.com:8443/pub/a", /not under an allowed prefix/],
      ["https://user@files.example.com/pub/a", /a user or password/],
    ];
    for (const [url, why] of hostile) expect(refusal(url), url).to.match(why).and.match(/^calls\[0\]\.stdin_url: /);
  });

  it("refuses a prefix that cannot be compared, naming the key", () => {
    for (const [prefix, why] of [["https://files.example.com/pub/?x=1", /no user, query or fragment/], ["https://files.example.com/..%2f/", /hides a '\/'/]] as const) {
      expect(() => compileDispatcherConfig({ stdinUrlPrefixes: [prefix] }), prefix).to.throw(why);
    }
  });

  it("writes a receipt's JSON exactly as toJson does", () => {
    const receipts = [
      create(ReceiptSchema, {}),
      create(ReceiptSchema, { exitCode: 0, duration: { seconds: 0n, nanos: 0 }, instanceId: "i" }),
      create(ReceiptSchema, { exitCode: -1, signal: "SIGKILL", duration: { seconds: 1n, nanos: 500_000_000 }, error: ErrorKind.KILLED, errorMessage: "killed" }),
      create(ReceiptSchema, { exitCode: 2, stderrLine: "ü", stdoutPrefix: new Uint8Array([0, 255, 7]), stdoutBytes: 1n << 40n, stdoutStreamed: true }),
      create(ReceiptSchema, { duration: { seconds: 0n, nanos: -1500 }, error: ErrorKind.TIMEOUT }),
      create(ReceiptSchema, { duration: { seconds: -3n, nanos: -123_456_000 } }),
      create(ReceiptSchema, { duration: { seconds: 12n, nanos: 7 }, stdoutPrefix: Buffer.from("hello world").subarray(6) }),
      create(ReceiptSchema, { error: 99 as ErrorKind }),
    ];
    for (const r of receipts) expect(JSON.stringify(receiptJson(r))).to.equal(JSON.stringify(toJson(ReceiptSchema, r)));
  });

  it("builds a submit's item as itemFromRow reads the row the insert wrote", () => {
    const row = {
      id: "6f0a2d1e-9c1b-4a55-8d2e-0f3c4b5a6d7e",
      state: "claimed" as const,
      claimed_by: "f",
      lease: "1",
      start_after: new Date(1000),
      attempts: 1,
      created_at: new Date(2000),
      claimed_at: new Date(3000),
      updated_at: new Date(4000),
    };
    const submits = [
      normalizeSubmit({ calls: [{ service: "true", args: [], env: {} }] }, createDefaultActions(), limits),
      normalizeSubmit(
        {
          calls: [{ service: "cat", args: ["-b"], env: { A: "1" }, timeoutMs: 1500, stdin: { kind: "data", data: Buffer.from("x") } }],
          priority: 3,
          idempotencyKey: "k",
          traceparent: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
          fairnessKey: "t",
          fairnessWeight: 2,
          fairnessLimit: 5,
        },
        createDefaultActions(),
        limits,
      ),
    ];
    for (const n of submits) {
      const merged = {
        ...row,
        kind: n.kind,
        priority: n.priority,
        payload: n.payload,
        max_attempts: n.maxAttempts,
        finished_at: null,
        result: null,
        output: null,
        output_blob: null,
        output_size: null,
        output_sha256: null,
        error: null,
        idempotency_key: n.idempotencyKey ?? null,
        cancel_requested_at: null,
        traceparent: n.traceparent ?? null,
        fairness_key: n.fairnessKey ?? "",
        fairness_weight: n.fairnessWeight ?? 1,
        fairness_limit: n.fairnessLimit ?? null,
      };
      expect(insertedItem(row, n)).to.deep.equal(itemFromRow(merged));
    }
  });
});
