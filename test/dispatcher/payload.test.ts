import { expect } from "chai";
import { createDefaultActions, normalizeSubmit, type ExecCallSpec } from "../../src/dispatcher/index.js";
import { decodePayload } from "../../src/dispatcher/payload.js";
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
