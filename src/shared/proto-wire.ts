/**
 * Hand-encoding of protobuf wire format for the few frames on hot paths (the execserver's
 * OFFER and HELLO, the fylr's WANT/UNWANT/JOB/DECLINE/QUERY). One set of rules for both
 * sides; unit tests compare every hand-encoded frame with protobuf-es's toBinary.
 */

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
