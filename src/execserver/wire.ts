import { toBinary } from "@bufbuild/protobuf";
import type * as grpc from "@grpc/grpc-js";
import { durationFromMs, DurationSchema } from "@bufbuild/protobuf/wkt";
import { BrokerService } from "../../gen/slotbroker/v1/broker_pb.js";
import { grpcServiceDefinition } from "../shared/grpc.js";
import { decodeConnectRequestFast } from "./wire-decode.js";
import { LEN, lengthFieldSize, varintSize, writeVarint } from "../shared/proto-wire.js";

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
 * the hot request frames are decoded by hand (wire-decode.ts), the rest by protobuf-es.
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
