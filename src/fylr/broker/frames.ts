import { toBinary } from "@bufbuild/protobuf";
import * as grpc from "@grpc/grpc-js";
import {
  BrokerService,
  ConnectRequestSchema,
  JobSpecSchema,
  type ConnectRequest,
  type JobSpec,
} from "../../../gen/slotbroker/v1/broker_pb.js";
import { grpcServiceDefinition } from "../../shared/grpc.js";
import { decodeConnectResponseFast } from "./frames-decode.js";
import {
  durationBodySize,
  lengthFieldSize,
  stringFieldSize,
  varintSize,
  writeDurationBody,
  writeLengthPrefix,
  writeStringField,
  writeVarint,
} from "../../shared/protobuf-wire.js";

// The frames a fylr sends per want and per job are encoded by hand straight into one
// Buffer instead of building message objects per frame (WANT/UNWANT go out by the
// thousand, again after each reconnect). Wire format (proto3), ConnectRequest:
//   want    = 1 LEN Want    { job_id = 1 LEN, service = 2 LEN, priority = 3 VARINT,
//                             fairness_key = 4 LEN, fairness_weight = 5 VARINT }
//   unwant  = 2 LEN Unwant  { job_id = 1 LEN }
//   job     = 3 LEN Job     { job_id = 1 LEN, offer_token = 2 LEN, spec = 3 LEN JobSpec (below) }
//   decline = 4 LEN Decline { job_id = 1 LEN, offer_token = 2 LEN }
//   query   = 6 LEN Query   { job_id = 1 LEN }
//   cancel  = 7 LEN Cancel  { job_id = 1 LEN }
// Empty strings are left out, as proto3 does; a sub-message is written even when empty.
// The varint and field helpers are shared with the execserver's OFFER (src/shared/protobuf-wire.ts).

/** A hand-encoded ConnectRequest carrying a Want; key "" and weight 0 are left out. */
export function encodeWant(jobId: string, service: string, priority: number, fairnessKey = "", fairnessWeight = 0): Buffer {
  const idLen = Buffer.byteLength(jobId);
  const serviceLen = Buffer.byteLength(service);
  const priorityLen = priority === 0 ? 0 : 1 + varintSize(priority);
  const keyLen = fairnessKey === "" ? 0 : Buffer.byteLength(fairnessKey);
  const weightLen = fairnessWeight === 0 ? 0 : 1 + varintSize(fairnessWeight);
  const inner = stringFieldSize(idLen) + stringFieldSize(serviceLen) + priorityLen + stringFieldSize(keyLen) + weightLen;
  const out = Buffer.allocUnsafe(1 + varintSize(inner) + inner);
  let at = 0;
  out[at++] = 0x0a;
  at = writeVarint(out, at, inner);
  at = writeStringField(out, at, 0x0a, jobId, idLen);
  at = writeStringField(out, at, 0x12, service, serviceLen);
  if (priority !== 0) {
    out[at++] = 0x18;
    at = writeVarint(out, at, priority);
  }
  at = writeStringField(out, at, 0x22, fairnessKey, keyLen);
  if (fairnessWeight !== 0) {
    out[at++] = 0x28;
    at = writeVarint(out, at, fairnessWeight);
  }
  return out;
}

/** A hand-encoded ConnectRequest carrying an Unwant. */
export function encodeUnwant(jobId: string): Buffer {
  return encodeStrings(0x12, jobId, "");
}

/** A hand-encoded ConnectRequest carrying a Decline. */
export function encodeDecline(jobId: string, offerToken: string): Buffer {
  return encodeStrings(0x22, jobId, offerToken);
}

/** A hand-encoded ConnectRequest carrying a Query. */
export function encodeQuery(jobId: string): Buffer {
  return encodeStrings(0x32, jobId, "");
}

/** A hand-encoded ConnectRequest carrying a Cancel. */
export function encodeCancel(jobId: string): Buffer {
  return encodeStrings(0x3a, jobId, "");
}

/** A hand-encoded ConnectRequest carrying a Job (a spec with env or labels is encoded by protobuf-es). */
export function encodeJob(jobId: string, offerToken: string, spec: JobSpec, traceparent = ""): Buffer {
  const specBytes = encodePlainSpec(spec) ?? toBinary(JobSpecSchema, spec);
  const idLen = Buffer.byteLength(jobId);
  const tokenLen = Buffer.byteLength(offerToken);
  const traceLen = Buffer.byteLength(traceparent);
  const inner = stringFieldSize(idLen) + stringFieldSize(tokenLen) + 1 + varintSize(specBytes.byteLength) + specBytes.byteLength + stringFieldSize(traceLen);
  const out = Buffer.allocUnsafe(1 + varintSize(inner) + inner);
  let at = 0;
  out[at++] = 0x1a;
  at = writeVarint(out, at, inner);
  at = writeStringField(out, at, 0x0a, jobId, idLen);
  at = writeStringField(out, at, 0x12, offerToken, tokenLen);
  out[at++] = 0x1a;
  at = writeVarint(out, at, specBytes.byteLength);
  out.set(specBytes, at);
  writeStringField(out, at + specBytes.byteLength, 0x22, traceparent, traceLen);
  return out;
}

// JobSpec { args = 1 repeated string, timeout = 3 Duration, stdin_url = 4, stdout_url = 5,
// stdin_inline = 7 bytes }: the spec the exec client sends for nearly every job, fields in
// number order as protobuf-es writes them. Maps and unknown fields: undefined.
function encodePlainSpec(spec: JobSpec): Buffer | undefined {
  if (spec.$unknown?.length || spec.timeout?.$unknown?.length) return undefined;
  for (const _ in spec.env) return undefined;
  for (const _ in spec.labels) return undefined;
  const argLens = spec.args.map((a) => Buffer.byteLength(a));
  const inLen = Buffer.byteLength(spec.stdinUrl);
  const outLen = Buffer.byteLength(spec.stdoutUrl);
  const inlineLen = spec.stdinInline.byteLength;
  const timeout = spec.timeout && durationBodySize(spec.timeout.seconds, spec.timeout.nanos);
  let size = stringFieldSize(inLen) + stringFieldSize(outLen) + stringFieldSize(inlineLen) + (timeout === undefined ? 0 : lengthFieldSize(timeout));
  for (const len of argLens) size += lengthFieldSize(len); // a repeated string keeps its empty entries
  const out = Buffer.allocUnsafe(size);
  let at = 0;
  spec.args.forEach((arg, i) => {
    at = writeLengthPrefix(out, at, 0x0a, argLens[i]!);
    at += out.write(arg, at, "utf8");
  });
  if (spec.timeout && timeout !== undefined) {
    at = writeLengthPrefix(out, at, 0x1a, timeout);
    at = writeDurationBody(out, at, spec.timeout.seconds, spec.timeout.nanos);
  }
  at = writeStringField(out, at, 0x22, spec.stdinUrl, inLen);
  at = writeStringField(out, at, 0x2a, spec.stdoutUrl, outLen);
  if (inlineLen > 0) {
    at = writeLengthPrefix(out, at, 0x3a, inlineLen);
    out.set(spec.stdinInline, at);
  }
  return out;
}

// A frame whose message has up to two string fields (1 and 2).
function encodeStrings(outerTag: number, first: string, second: string): Buffer {
  const firstLen = Buffer.byteLength(first);
  const secondLen = Buffer.byteLength(second);
  const inner = stringFieldSize(firstLen) + stringFieldSize(secondLen);
  const out = Buffer.allocUnsafe(1 + varintSize(inner) + inner);
  let at = 0;
  out[at++] = outerTag;
  at = writeVarint(out, at, inner);
  at = writeStringField(out, at, 0x0a, first, firstLen);
  writeStringField(out, at, 0x12, second, secondLen);
  return out;
}

/** What the broker stream accepts: a message, or bytes already encoded by hand. */
export type OutgoingFrame = ConnectRequest | Buffer;

/**
 * The grpc-js client constructor for BrokerService whose Connect stream also takes
 * pre-encoded frames (Buffers pass through unchanged) and decodes OFFER, DONE and PONG by
 * hand (frames-decode.ts), everything else with protobuf-es.
 */
export function brokerClientConstructor(): grpc.ServiceClientConstructor {
  const base = grpcServiceDefinition(BrokerService);
  const connect = base.connect!;
  const serialize = connect.requestSerialize;
  const deserialize = connect.responseDeserialize;
  const definition: grpc.ServiceDefinition = {
    ...base,
    connect: {
      ...connect,
      requestSerialize: (frame: OutgoingFrame) => (Buffer.isBuffer(frame) ? frame : serialize(frame)),
      responseDeserialize: (bytes: Buffer): object => decodeConnectResponseFast(bytes) ?? (deserialize(bytes) as object),
    },
  };
  return grpc.makeGenericClientConstructor(definition, BrokerService.name);
}

/** The protobuf-es encoding of a frame (for tests comparing against the hand encoders). */
export function encodeWithSchema(frame: ConnectRequest): Uint8Array {
  return toBinary(ConnectRequestSchema, frame);
}
