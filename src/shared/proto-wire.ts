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
