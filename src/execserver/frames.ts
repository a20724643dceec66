/**
 * The broker stream's frames as the execserver writes and reads them: OFFER, HELLO and DONE
 * encoded by hand (below), the hot request frames decoded by hand (frames-decode.ts), and
 * the grpc-js service definition that passes both through. The fylr's side has the same
 * pair of files (src/fylr/broker/frames.ts, frames-decode.ts); the wire helpers both use
 * are in src/shared/protobuf-wire.ts.
 */
import { toBinary } from "@bufbuild/protobuf";
import { durationFromMs, DurationSchema } from "@bufbuild/protobuf/wkt";
import type * as grpc from "@grpc/grpc-js";
import { BrokerService, ErrorKind, type Receipt } from "../../gen/slotbroker/v1/broker_pb.js";
import { grpcServiceDefinition } from "../shared/grpc.js";
import {
  durationBodySize,
  LEN,
  lengthFieldSize,
  stringFieldSize,
  varint64Size,
  varintSize,
  writeDurationBody,
  writeLengthPrefix,
  writeStringField,
  writeVarint,
  writeVarint64,
} from "../shared/protobuf-wire.js";
import { decodeConnectRequestFast } from "./frames-decode.js";

// OFFER is the frame on the grant path, and protobuf-es's reflective encoder costs several
// microseconds per frame there. This file writes that one frame by hand (its schema is
// tiny and fixed); every other frame still goes through toBinary. A unit test checks the
// bytes against toBinary, so the two cannot drift apart silently.

const OFFER_FIELD = 2; // ConnectResponse.offer

/** Precomputed parts of OFFER frames for one server (its offer timeout, its waitgroups). */
export class OfferEncoder {
  private readonly expiresIn: Buffer;
  private readonly waitgroups = new Map<string, Buffer>();

  constructor(offerTimeoutMs: number) {
    this.expiresIn = Buffer.from(toBinary(DurationSchema, durationFromMs(offerTimeoutMs)));
  }

  /** The serialized ConnectResponse{offer{job_id, offer_token, expires_in, waitgroup}}. */
  encode(jobId: string, offerToken: string, waitgroup: string): Buffer {
    let wg = this.waitgroups.get(waitgroup);
    if (!wg) {
      wg = Buffer.from(waitgroup, "utf8");
      this.waitgroups.set(waitgroup, wg);
    }
    const jobLen = Buffer.byteLength(jobId, "utf8");
    const tokenLen = Buffer.byteLength(offerToken, "utf8");
    const inner =
      lengthFieldSize(jobLen) + lengthFieldSize(tokenLen) + lengthFieldSize(this.expiresIn.length) + lengthFieldSize(wg.length);
    const out = Buffer.allocUnsafe(1 + varintSize(inner) + inner);
    let at = 0;
    out[at++] = (OFFER_FIELD << 3) | LEN;
    at = writeVarint(out, at, inner);
    out[at++] = (1 << 3) | LEN;
    at = writeVarint(out, at, jobLen);
    at += out.write(jobId, at, "utf8");
    out[at++] = (2 << 3) | LEN;
    at = writeVarint(out, at, tokenLen);
    at += out.write(offerToken, at, "utf8");
    // A set message field is written even when empty (explicit presence).
    out[at++] = (3 << 3) | LEN;
    at = writeVarint(out, at, this.expiresIn.length);
    at += this.expiresIn.copy(out, at);
    out[at++] = (4 << 3) | LEN;
    at = writeVarint(out, at, wg.length);
    wg.copy(out, at);
    return out;
  }
}

/**
 * A ConnectResponse{hello} frame from a Hello encoded without peer_address (shared by all
 * peers) plus this peer's address. A broadcast to N peers then encodes the Hello once and
 * only appends N short fields. (Field order differs from toBinary's; parsers accept any.)
 */
export function helloFrame(sharedHello: Uint8Array, peerAddress: string): Buffer {
  const peerLen = Buffer.byteLength(peerAddress, "utf8");
  const inner = sharedHello.length + (peerLen > 0 ? lengthFieldSize(peerLen) : 0);
  const out = Buffer.allocUnsafe(1 + varintSize(inner) + inner);
  let at = 0;
  out[at++] = (1 << 3) | LEN; // ConnectResponse.hello
  at = writeVarint(out, at, inner);
  out.set(sharedHello, at);
  at += sharedHello.length;
  if (peerLen > 0) {
    out[at++] = (6 << 3) | LEN; // Hello.peer_address
    at = writeVarint(out, at, peerLen);
    out.write(peerAddress, at, "utf8");
  }
  return out;
}

/**
 * BrokerService's grpc-js definition for the server: Connect responses may be handed over
 * already encoded (a Uint8Array, e.g. from OfferEncoder) and are then written as they are;
 * the hot request frames are decoded by hand (frames-decode.ts), the rest by protobuf-es.
 */
export function serverServiceDefinition(): grpc.ServiceDefinition {
  const definition = grpcServiceDefinition(BrokerService);
  const connect = definition.connect!;
  const serialize = connect.responseSerialize;
  const deserialize = connect.requestDeserialize;
  return {
    ...definition,
    connect: {
      ...connect,
      requestDeserialize: (bytes: Buffer): object => decodeConnectRequestFast(bytes) ?? (deserialize(bytes) as object),
      responseSerialize: (message: object) =>
        message instanceof Uint8Array ? Buffer.from(message.buffer, message.byteOffset, message.byteLength) : serialize(message),
    },
  };
}

// DONE goes out once per job; protobuf-es's reflective encoder costs more than the rest of
// the job's bookkeeping there. Written by hand like OFFER (above), in field order as
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
