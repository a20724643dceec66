import { ErrorKind, type Receipt } from "../../gen/slotbroker/v1/broker_pb.js";
import {
  durationBodySize,
  lengthFieldSize,
  stringFieldSize,
  varint64Size,
  varintSize,
  writeDurationBody,
  writeLengthPrefix,
  writeStringField,
  writeVarint,
  writeVarint64,
} from "../shared/proto-wire.js";

// DONE goes out once per job; protobuf-es's reflective encoder costs more than the rest of
// the job's bookkeeping there. Written by hand like OFFER (wire.ts), in field order as
// toBinary writes it; a receipt carrying unknown fields is left to toBinary (undefined).
// Unit tests compare the bytes with toBinary on random receipts.

/** The serialized ConnectResponse{done{job_id, receipt}}, or undefined when toBinary must do it. */
export function encodeDone(jobId: string, receipt: Receipt): Buffer | undefined {
  if (receipt.$unknown?.length || receipt.duration?.$unknown?.length) return undefined;
  const r = receipt;
  const lens = {
    signal: Buffer.byteLength(r.signal),
    stderr: Buffer.byteLength(r.stderrLine),
    message: Buffer.byteLength(r.errorMessage),
    instance: Buffer.byteLength(r.instanceId),
  };
  const duration = r.duration && durationBodySize(r.duration.seconds, r.duration.nanos);
  const receiptSize =
    (r.exitCode === undefined ? 0 : 1 + varintSize(r.exitCode)) +
    stringFieldSize(lens.signal) +
    (duration === undefined ? 0 : lengthFieldSize(duration)) +
    stringFieldSize(lens.stderr) +
    (r.stdoutPrefix.length === 0 ? 0 : lengthFieldSize(r.stdoutPrefix.length)) +
    (r.stdoutBytes === 0n ? 0 : 1 + varint64Size(r.stdoutBytes)) +
    (r.stdoutStreamed ? 2 : 0) +
    (r.error === ErrorKind.UNSPECIFIED ? 0 : 1 + varintSize(r.error)) +
    stringFieldSize(lens.message) +
    stringFieldSize(lens.instance);
  const idLen = Buffer.byteLength(jobId);
  const inner = stringFieldSize(idLen) + lengthFieldSize(receiptSize);
  const out = Buffer.allocUnsafe(1 + varintSize(inner) + inner);
  let at = writeLengthPrefix(out, 0, 0x1a, inner); // ConnectResponse.done = 3
  at = writeStringField(out, at, 0x0a, jobId, idLen);
  // A set message field is written even when empty (explicit presence).
  at = writeLengthPrefix(out, at, 0x12, receiptSize);
  if (r.exitCode !== undefined) {
    out[at++] = 0x08;
    at = writeVarint(out, at, r.exitCode);
  }
  at = writeStringField(out, at, 0x12, r.signal, lens.signal);
  if (r.duration && duration !== undefined) {
    at = writeLengthPrefix(out, at, 0x1a, duration);
    at = writeDurationBody(out, at, r.duration.seconds, r.duration.nanos);
  }
  at = writeStringField(out, at, 0x22, r.stderrLine, lens.stderr);
  if (r.stdoutPrefix.length > 0) {
    at = writeLengthPrefix(out, at, 0x2a, r.stdoutPrefix.length);
    out.set(r.stdoutPrefix, at);
    at += r.stdoutPrefix.length;
  }
  if (r.stdoutBytes !== 0n) {
    out[at++] = 0x30;
    at = writeVarint64(out, at, r.stdoutBytes);
  }
  if (r.stdoutStreamed) {
    out[at++] = 0x38;
    out[at++] = 1;
  }
  if (r.error !== ErrorKind.UNSPECIFIED) {
    out[at++] = 0x40;
    at = writeVarint(out, at, r.error);
  }
  at = writeStringField(out, at, 0x4a, r.errorMessage, lens.message);
  writeStringField(out, at, 0x52, r.instanceId, lens.instance);
  return out;
}
