import { toBinary } from "@bufbuild/protobuf";
import * as grpc from "@grpc/grpc-js";
import { BrokerService, ConnectRequestSchema, type ConnectRequest } from "../../../gen/slotbroker/v1/broker_pb.js";
import { grpcServiceDefinition } from "../../shared/grpc.js";

// WANT and UNWANT are the frames a fylr sends by the thousand (every parked want, again
// after each reconnect), so they are encoded by hand straight into one Buffer instead of
// building a message object per frame. Wire format (proto3):
//   ConnectRequest.want   = field 1, LEN: Want   { job_id = 1 LEN, service = 2 LEN, priority = 3 VARINT }
//   ConnectRequest.unwant = field 2, LEN: Unwant { job_id = 1 LEN }

/** A hand-encoded ConnectRequest carrying a Want. */
export function encodeWant(jobId: string, service: string, priority: number): Buffer {
  const idLen = Buffer.byteLength(jobId);
  const serviceLen = Buffer.byteLength(service);
  const priorityLen = priority === 0 ? 0 : 1 + varintSize(priority);
  const inner = 1 + varintSize(idLen) + idLen + 1 + varintSize(serviceLen) + serviceLen + priorityLen;
  const out = Buffer.allocUnsafe(1 + varintSize(inner) + inner);
  let at = 0;
  out[at++] = 0x0a;
  at = writeVarint(out, at, inner);
  out[at++] = 0x0a;
  at = writeVarint(out, at, idLen);
  at += out.write(jobId, at);
  out[at++] = 0x12;
  at = writeVarint(out, at, serviceLen);
  at += out.write(service, at);
  if (priority !== 0) {
    out[at++] = 0x18;
    at = writeVarint(out, at, priority);
  }
  return out;
}

/** A hand-encoded ConnectRequest carrying an Unwant. */
export function encodeUnwant(jobId: string): Buffer {
  const idLen = Buffer.byteLength(jobId);
  const inner = 1 + varintSize(idLen) + idLen;
  const out = Buffer.allocUnsafe(1 + varintSize(inner) + inner);
  let at = 0;
  out[at++] = 0x12;
  at = writeVarint(out, at, inner);
  out[at++] = 0x0a;
  at = writeVarint(out, at, idLen);
  out.write(jobId, at);
  return out;
}

// int32 varint: negative values are sign-extended to 64 bits, so they take ten bytes.
function varintSize(value: number): number {
  if (value < 0) return 10;
  let size = 1;
  while (value >= 0x80) {
    value = Math.floor(value / 128);
    size++;
  }
  return size;
}

function writeVarint(out: Buffer, at: number, value: number): number {
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

/** What the broker stream accepts: a message, or bytes already encoded by hand. */
export type OutgoingFrame = ConnectRequest | Buffer;

/**
 * The grpc-js client constructor for BrokerService whose Connect stream also takes
 * pre-encoded frames (Buffers pass through unchanged).
 */
export function brokerClientConstructor(): grpc.ServiceClientConstructor {
  const base = grpcServiceDefinition(BrokerService);
  const connect = base.connect!;
  const serialize = connect.requestSerialize;
  const definition: grpc.ServiceDefinition = {
    ...base,
    connect: { ...connect, requestSerialize: (frame: OutgoingFrame) => (Buffer.isBuffer(frame) ? frame : serialize(frame)) },
  };
  return grpc.makeGenericClientConstructor(definition, BrokerService.name);
}

/** The protobuf-es encoding of a frame (for tests comparing against the hand encoders). */
export function encodeWithSchema(frame: ConnectRequest): Uint8Array {
  return toBinary(ConnectRequestSchema, frame);
}
