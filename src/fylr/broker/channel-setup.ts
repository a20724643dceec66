import { readFileSync } from "node:fs";
import * as grpc from "@grpc/grpc-js";
import type { ConnectResponse } from "../../../gen/slotbroker/v1/broker_pb.js";
import { Code, SlotbrokerError } from "../../shared/errors.js";
import { brokerClientConstructor, type OutgoingFrame } from "./frames.js";

/** TLS towards the execserver: a CA bundle to trust and an optional name to verify. */
export interface BrokerTlsOptions {
  /** PEM file with the CA certificates to trust; the system roots when unset. */
  readonly caFile?: string;
  /** Expected server name when it differs from the address host. */
  readonly serverName?: string;
}

const caFiles = new Map<string, Buffer>();

/** Channel credentials: plaintext, or TLS with the configured CA (read once per file). */
export function channelCredentials(tls: BrokerTlsOptions | undefined): grpc.ChannelCredentials {
  if (!tls) return grpc.credentials.createInsecure();
  let ca: Buffer | undefined;
  if (tls.caFile) {
    ca = caFiles.get(tls.caFile);
    if (!ca) caFiles.set(tls.caFile, (ca = readFileSync(tls.caFile)));
  }
  return grpc.credentials.createSsl(ca ?? null);
}

/** grpc-js channel options of one broker connection. */
export function channelOptions(keepaliveTimeMs: number, keepaliveTimeoutMs: number, tls: BrokerTlsOptions | undefined): grpc.ChannelOptions {
  const options: grpc.ChannelOptions = {
    // Own subchannel pool per channel: every connection is its own TCP connection, even to
    // the same address, so a load balancer can spread them.
    "grpc.use_local_subchannel_pool": 1,
    "grpc.keepalive_time_ms": keepaliveTimeMs,
    "grpc.keepalive_timeout_ms": keepaliveTimeoutMs,
    "grpc.keepalive_permit_without_calls": 1,
    "grpc.enable_retries": 0,
  };
  if (tls?.serverName) options["grpc.ssl_target_name_override"] = tls.serverName;
  return options;
}

/** Call metadata: the bearer token (never logged) and this fylr's name. */
export function callMetadata(token: string | undefined, clientName: string): grpc.Metadata {
  const metadata = new grpc.Metadata();
  if (token) metadata.set("authorization", `Bearer ${token}`);
  metadata.set("slotbroker-client", clientName);
  return metadata;
}

// grpc-js status codes are translated once, here, into the project's error type.
/** A SlotbrokerError for a failed broker stream. */
export function translateStreamError(err: grpc.ServiceError, name: string): SlotbrokerError {
  const code = typeof err.code === "number" ? (err.code as number as Code) : Code.Unavailable;
  const details = err.details || err.message;
  if (code === Code.Unauthenticated) {
    return new SlotbrokerError(code, `execserver ${name} refused the token (UNAUTHENTICATED): ${details}`, { cause: err });
  }
  return new SlotbrokerError(code, `broker stream to ${name} failed: ${details}`, { cause: err });
}

/** One Connect stream: pre-encoded or protobuf-es frames out, responses in. */
export type ConnectCall = grpc.ClientDuplexStream<OutgoingFrame, ConnectResponse>;

/** What opening one broker stream needs. */
export interface StreamTarget {
  readonly address: string;
  readonly token: string | undefined;
  readonly clientName: string;
  readonly tls: BrokerTlsOptions | undefined;
  readonly keepaliveTimeMs: number;
  readonly keepaliveTimeoutMs: number;
}

const BrokerStub = brokerClientConstructor();

/** Opens a Connect stream on a channel of its own (so its own TCP connection); close both when done. */
export function openConnectStream(target: StreamTarget): { client: grpc.Client; call: ConnectCall } {
  const { address, tls } = target;
  const client = new BrokerStub(address, channelCredentials(tls), channelOptions(target.keepaliveTimeMs, target.keepaliveTimeoutMs, tls));
  const metadata = callMetadata(target.token, target.clientName);
  const call = (client as unknown as { connect(md: grpc.Metadata): ConnectCall }).connect(metadata);
  return { client, call };
}
