/**
 * The protobuf wire format by hand, for the few frames on hot paths, where protobuf-es's
 * reflective encoder and decoder cost several microseconds per frame: the low-level
 * helpers both ends' frame codecs share (src/execserver/frames*.ts, src/fylr/broker/
 * frames*.ts). One set of rules for both sides.
 */

/**
 * A key an RPC implementation may put on its answer (an init object): a function giving
 * the answer's binary encoding built without the message, or undefined to have the
 * message built and encoded as usual. The fylr's direct unary path reads it.
 */
export const binaryAnswer = Symbol("binaryAnswer");

/** An answer that may carry its own binary encoding (see binaryAnswer). */
export interface BinaryAnswer {
  readonly [binaryAnswer]?: () => Uint8Array | undefined;
}

/**
 * A key an RPC implementation object may carry: hand decoders of its methods' binary
 * requests, by method local name, each answering undefined to leave the bytes to
 * protobuf-es. The fylr's direct unary path reads it.
 */
export const binaryRequests = Symbol("binaryRequests");

/** An implementation that may carry hand decoders (see binaryRequests). */
export interface BinaryRequests {
  readonly [binaryRequests]?: Readonly<Record<string, (bytes: Uint8Array) => unknown>>;
}

// --- writing -------------------------------------------------------------------------
//
// Hand-encoding for the execserver's OFFER, HELLO and DONE and the fylr's
// WANT/UNWANT/JOB/DECLINE/QUERY; unit tests compare every hand-encoded frame with
// protobuf-es's toBinary.

/** Wire type 2: length-delimited (strings, bytes, sub-messages). */
export const LEN = 2;

/** The one-byte tag of field `field` (1..15) with wire type `wireType`. */
export function tag(field: number, wireType: number): number {
  return (field << 3) | wireType;
}

/** Bytes of `value` as a varint, with int32 rules: a negative value is sign-extended to ten bytes. */
export function varintSize(value: number): number {
  if (value < 0) return 10;
  let size = 1;
  while (value >= 0x80) {
    value = Math.floor(value / 128);
    size++;
  }
  return size;
}

/** Writes `value` as a varint (int32 rules) at `at`; returns the offset after it. */
export function writeVarint(out: Uint8Array, at: number, value: number): number {
  if (value < 0) {
    let v = BigInt.asUintN(64, BigInt(value));
    for (let i = 0; i < 9; i++) {
      out[at++] = Number(v & 0x7fn) | 0x80;
      v >>= 7n;
    }
    out[at++] = Number(v);
    return at;
  }
  while (value >= 0x80) {
    out[at++] = (value & 0x7f) | 0x80;
    value = Math.floor(value / 128);
  }
  out[at++] = value;
  return at;
}

/** Bytes of a length-delimited field of `length` bytes: tag, length, data. Always written. */
export function lengthFieldSize(length: number): number {
  return 1 + varintSize(length) + length;
}

/** Bytes of a proto3 string field: nothing when empty (proto3 leaves it out), else as lengthFieldSize. */
export function stringFieldSize(length: number): number {
  return length === 0 ? 0 : lengthFieldSize(length);
}

/** Writes a tag and a length at `at`; the caller writes the `length` bytes after it. */
export function writeLengthPrefix(out: Uint8Array, at: number, fieldTag: number, length: number): number {
  out[at++] = fieldTag;
  return writeVarint(out, at, length);
}

/** Writes a proto3 string field (`length` = its UTF-8 byte length); nothing when empty. */
export function writeStringField(out: Buffer, at: number, fieldTag: number, text: string, length: number): number {
  if (length === 0) return at;
  at = writeLengthPrefix(out, at, fieldTag, length);
  return at + out.write(text, at, "utf8");
}

/** Bytes of a 64-bit varint (int64/uint64 rules: a negative value takes ten bytes). */
export function varint64Size(value: bigint): number {
  if (value >= 0n && value < 0x80000000n) return varintSize(Number(value));
  let v = BigInt.asUintN(64, value);
  let size = 1;
  while (v >= 0x80n) {
    v >>= 7n;
    size++;
  }
  return size;
}

/** Writes a 64-bit varint (int64/uint64 rules) at `at`; returns the offset after it. */
export function writeVarint64(out: Uint8Array, at: number, value: bigint): number {
  if (value >= 0n && value < 0x80000000n) return writeVarint(out, at, Number(value));
  let v = BigInt.asUintN(64, value);
  while (v >= 0x80n) {
    out[at++] = Number(v & 0x7fn) | 0x80;
    v >>= 7n;
  }
  out[at++] = Number(v);
  return at;
}

/** A google.protobuf.Duration as its fields: seconds (int64) and nanos (int32), zeros left out. */
export function durationBodySize(seconds: bigint, nanos: number): number {
  return (seconds === 0n ? 0 : 1 + varint64Size(seconds)) + (nanos === 0 ? 0 : 1 + varintSize(nanos));
}

/** Writes a Duration's fields (without tag and length) at `at`. */
export function writeDurationBody(out: Uint8Array, at: number, seconds: bigint, nanos: number): number {
  if (seconds !== 0n) {
    out[at++] = 0x08;
    at = writeVarint64(out, at, seconds);
  }
  if (nanos !== 0) {
    out[at++] = 0x10;
    at = writeVarint(out, at, nanos);
  }
  return at;
}

// --- reading -------------------------------------------------------------------------
//
// Hand-decoding of protobuf wire format for the few frames on hot paths (the execserver's
// WANT/UNWANT/JOB/DECLINE/PING, the fylr's OFFER/DONE/PONG). The reader follows
// protobuf-es's own rules (varints, tags, strict UTF-8 for proto3 strings), and a hand
// decoder gives up (returns undefined) on anything it does not expect: an unknown field, a
// wrong wire type, a repeated sub-message, malformed bytes. The caller then decodes the
// frame with protobuf-es, so every frame gets exactly protobuf-es's result or its error.
// Unit tests compare both decoders on random and corrupted frames.

/** Thrown inside a hand decoder when it gives up; never escapes `tryDecode`. */
class GiveUp extends Error {}
const giveUp = new GiveUp("not a frame the hand decoder takes");

/** Runs a hand decoder; undefined when it gave up or the bytes were malformed. */
export function tryDecode<T>(bytes: Uint8Array, decode: (r: WireReader) => T): T | undefined {
  try {
    return decode(new WireReader(bytes));
  } catch {
    return undefined;
  }
}

/** Gives up decoding: the caller falls back to protobuf-es. */
export function bail(): never {
  throw giveUp;
}

const strictUtf8 = new TextDecoder("utf-8", { fatal: true });

/** A cursor over protobuf wire bytes (the subset of protobuf-es's BinaryReader the hot frames use). */
export class WireReader {
  pos = 0;
  private readonly buf: Uint8Array;
  private readonly ascii: Buffer;

  constructor(buf: Uint8Array) {
    this.buf = buf;
    this.ascii = Buffer.isBuffer(buf) ? buf : Buffer.from(buf.buffer, buf.byteOffset, buf.byteLength);
  }

  get length(): number {
    return this.buf.length;
  }

  /** Field number × 8 + wire type, checked as protobuf-es checks it; gives up on wire types 3–5 (groups, fixed32). */
  tag(): number {
    const start = this.pos;
    const tag = this.uint32();
    const read = this.pos - start;
    if (read > 5 || (read === 5 && this.buf[this.pos - 1]! > 0x0f)) bail();
    if (tag >>> 3 === 0 || (tag & 7) > 2) bail();
    return tag;
  }

  /** An unsigned 32-bit varint (protobuf-es's varint32read). */
  uint32(): number {
    const buf = this.buf;
    let b = buf[this.pos++]!;
    let result = b & 0x7f;
    if ((b & 0x80) === 0) return this.checked(result);
    b = buf[this.pos++]!;
    result |= (b & 0x7f) << 7;
    if ((b & 0x80) === 0) return this.checked(result);
    b = buf[this.pos++]!;
    result |= (b & 0x7f) << 14;
    if ((b & 0x80) === 0) return this.checked(result);
    b = buf[this.pos++]!;
    result |= (b & 0x7f) << 21;
    if ((b & 0x80) === 0) return this.checked(result);
    b = buf[this.pos++]!;
    result |= (b & 0x0f) << 28;
    for (let read = 5; (b & 0x80) !== 0 && read < 10; read++) b = buf[this.pos++]!;
    if ((b & 0x80) !== 0) bail();
    return this.checked(result >>> 0);
  }

  /** A signed 32-bit varint (int32, enums). */
  int32(): number {
    return this.uint32() | 0;
  }

  /** A 64-bit varint as [low, high] 32-bit halves (protobuf-es's varint64read). */
  varint64(): [number, number] {
    const buf = this.buf;
    let lo = 0;
    let hi = 0;
    for (let shift = 0; shift < 28; shift += 7) {
      const b = buf[this.pos++]!;
      lo |= (b & 0x7f) << shift;
      if ((b & 0x80) === 0) return this.checked64(lo, hi);
    }
    const middle = buf[this.pos++]!;
    lo |= (middle & 0x0f) << 28;
    hi = (middle & 0x70) >> 4;
    if ((middle & 0x80) === 0) return this.checked64(lo, hi);
    for (let shift = 3; shift <= 31; shift += 7) {
      const b = buf[this.pos++]!;
      hi |= (b & 0x7f) << shift;
      if ((b & 0x80) === 0) return this.checked64(lo, hi);
    }
    return bail();
  }

  uint64(): bigint {
    const [lo, hi] = this.varint64();
    return hi === 0 ? BigInt(lo >>> 0) : BigInt.asUintN(64, (BigInt(hi >>> 0) << 32n) | BigInt(lo >>> 0));
  }

  int64(): bigint {
    const [lo, hi] = this.varint64();
    return hi === 0 && lo >= 0 ? BigInt(lo) : BigInt.asIntN(64, (BigInt(hi >>> 0) << 32n) | BigInt(lo >>> 0));
  }

  bool(): boolean {
    const [lo, hi] = this.varint64();
    return lo !== 0 || hi !== 0;
  }

  /** A length-delimited field's bytes, a view into the frame (as protobuf-es returns them). */
  bytes(): Uint8Array {
    const end = this.end();
    const start = this.pos;
    this.pos = end;
    return this.buf.subarray(start, end);
  }

  /** The frame's bytes from `start` to `end` (a view). */
  view(start: number, end: number): Uint8Array {
    return this.buf.subarray(start, end);
  }

  /** A proto3 string: ASCII is sliced directly; anything else must be valid UTF-8. */
  string(): string {
    const end = this.end();
    const start = this.pos;
    this.pos = end;
    const buf = this.buf;
    for (let i = start; i < end; i++) {
      if (buf[i]! >= 0x80) return strictUtf8.decode(buf.subarray(start, end));
    }
    return this.ascii.toString("latin1", start, end);
  }

  /** Reads a length prefix; returns where the sub-message ends. */
  end(): number {
    const len = this.uint32();
    const end = this.pos + len;
    if (end > this.buf.length) bail();
    return end;
  }

  private checked(value: number): number {
    if (this.pos > this.buf.length) bail();
    return value;
  }

  private checked64(lo: number, hi: number): [number, number] {
    if (this.pos > this.buf.length) bail();
    return [lo, hi];
  }
}

/** Wire type 0 (varint) and 2 (length-delimited) tags of field `n`. */
export const varintTag = (n: number): number => n << 3;
export const lenTag = (n: number): number => (n << 3) | 2;

/** google.protobuf.Duration {seconds = 1 int64, nanos = 2 int32}, up to `end`. */
export function readDuration(r: WireReader, end: number): { $typeName: "google.protobuf.Duration"; seconds: bigint; nanos: number } {
  const d = { $typeName: "google.protobuf.Duration" as const, seconds: 0n, nanos: 0 };
  while (r.pos < end) {
    const t = r.tag();
    if (t === varintTag(1)) d.seconds = r.int64();
    else if (t === varintTag(2)) d.nanos = r.int32();
    else bail();
  }
  return ended(r, end, d);
}

/** `value`, after checking that the last field ended exactly at its message's `end` (a field running past it is malformed). */
export function ended<T>(r: WireReader, end: number, value: T): T {
  if (r.pos !== end) bail();
  return value;
}

/** A message whose only field is `uint64 = 1` (Ping, Pong: the nonce). */
export function readNonce(r: WireReader, end: number): bigint {
  let nonce = 0n;
  while (r.pos < end) {
    if (r.tag() === varintTag(1)) nonce = r.uint64();
    else bail();
  }
  return ended(r, end, nonce);
}
