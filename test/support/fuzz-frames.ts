// Random frames and their corruptions, for checking a hand decoder against protobuf-es:
// whenever the hand decoder answers, protobuf-es must decode the same bytes to an equal
// message (and re-encode it to the same bytes); when it gives up, protobuf-es decides.
import { create, equals, fromBinary, toBinary, type DescMessage, type MessageShape } from "@bufbuild/protobuf";
import { expect } from "chai";
import { ReceiptSchema, type Receipt } from "../../gen/slotbroker/v1/broker_pb.js";

/** A small seeded PRNG (mulberry32), so a failing case can be replayed. */
export class Rand {
  constructor(private state: number) {}

  next(): number {
    let t = (this.state = (this.state + 0x6d2b79f5) | 0);
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  }

  int(n: number): number {
    return Math.floor(this.next() * n);
  }

  pick<T>(items: readonly T[]): T {
    return items[this.int(items.length)]!;
  }

  chance(p: number): boolean {
    return this.next() < p;
  }

  /** ASCII, multi-byte UTF-8, empty, or long. */
  string(): string {
    const kind = this.int(6);
    if (kind === 0) return "";
    if (kind === 1) return this.pick(["jöb-ü€", "😀x", "ß", "\u0000nul", "日本"]);
    if (kind === 2) return "x".repeat(100 + this.int(300));
    const length = 1 + this.int(24);
    let s = "";
    for (let i = 0; i < length; i++) s += String.fromCharCode(32 + this.int(95));
    return s;
  }

  int32(): number {
    return this.pick([0, 1, -1, 127, 128, 300, 2 ** 31 - 1, -(2 ** 31), this.int(2 ** 31) - 2 ** 30]);
  }

  uint64(): bigint {
    return this.pick([0n, 1n, 127n, 2n ** 32n, 2n ** 63n, 2n ** 64n - 1n, BigInt(this.int(2 ** 31))]);
  }

  bytes(max: number): Uint8Array {
    const out = new Uint8Array(this.int(max));
    for (let i = 0; i < out.length; i++) out[i] = this.int(256);
    return out;
  }
}

/** Corruptions of valid frames: flipped bytes, cuts, trailing junk, two frames merged. */
export function corrupt(rand: Rand, bytes: Uint8Array, other: Uint8Array): Uint8Array {
  const out = Uint8Array.from(bytes);
  switch (rand.int(5)) {
    case 0:
      if (out.length > 0) out[rand.int(out.length)] = rand.int(256);
      return out;
    case 1:
      return out.subarray(0, rand.int(out.length + 1));
    case 2:
      return Buffer.concat([out, rand.bytes(6)]);
    case 3:
      // Concatenated messages merge in protobuf: the last scalar wins, sub-messages merge.
      return Buffer.concat([out, other]);
    default:
      return rand.bytes(24);
  }
}

/** Tallies of one comparison run. */
export interface Agreement {
  handDecoded: number;
  leftToProtobufEs: number;
}

/** Compares `fast` with protobuf-es on `bytes`; see the file comment. */
export function expectAgreement<D extends DescMessage>(
  schema: D,
  fast: (bytes: Uint8Array) => MessageShape<D> | undefined,
  bytes: Uint8Array,
  tally: Agreement,
): void {
  const hand = fast(Buffer.from(bytes));
  if (hand === undefined) {
    tally.leftToProtobufEs++;
    return;
  }
  tally.handDecoded++;
  let generic: MessageShape<D>;
  try {
    generic = fromBinary(schema, bytes);
  } catch (err) {
    expect.fail(`hand decoder accepted bytes protobuf-es rejects (${(err as Error).message}): ${Buffer.from(bytes).toString("hex")}`);
  }
  const hex = Buffer.from(bytes).toString("hex");
  expect(equals(schema, hand, generic), `decoded messages differ for ${hex}`).to.equal(true);
  expect(Buffer.from(toBinary(schema, hand)).equals(Buffer.from(toBinary(schema, generic))), `re-encoded bytes differ for ${hex}`).to.equal(true);
  expect(Object.keys(hand).sort(), `message keys differ for ${hex}`).to.deep.equal(Object.keys(generic).sort());
}

/** A random receipt (unset one time in ten), every field exercised. */
export function randomReceipt(rand: Rand): Receipt | undefined {
  if (rand.chance(0.1)) return undefined;
  return create(ReceiptSchema, {
    exitCode: rand.chance(0.7) ? rand.int32() : undefined,
    signal: rand.chance(0.2) ? "SIGKILL" : "",
    duration: rand.chance(0.8) ? { seconds: BigInt(rand.int32()), nanos: rand.int32() } : undefined,
    stderrLine: rand.chance(0.3) ? rand.string() : "",
    stdoutPrefix: rand.chance(0.5) ? rand.bytes(4000) : new Uint8Array(0),
    stdoutBytes: rand.uint64(),
    stdoutStreamed: rand.chance(0.3),
    error: rand.int(6),
    errorMessage: rand.chance(0.2) ? rand.string() : "",
    instanceId: rand.string(),
  });
}
