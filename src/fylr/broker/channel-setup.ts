import { readFileSync } from "node:fs";
import { createSecureContext } from "node:tls";
import * as grpc from "@grpc/grpc-js";
import type { ConnectResponse } from "../../../gen/slotbroker/v1/broker_pb.js";
import { Code, ConfigError, SlotbrokerError } from "../../shared/errors.js";
import { brokerClientConstructor, type OutgoingFrame } from "./frames.js";

/** TLS towards the execserver: a CA bundle to trust, an optional name to verify, and a client certificate for mutual TLS. */
export interface BrokerTlsOptions {
  /** PEM file with the CA certificates to trust; the system roots when unset. */
  readonly caFile?: string;
  /** Expected server name when it differs from the address host. */
  readonly serverName?: string;
  /** PEM certificate chain this fylr presents (an execserver with clientCaFile requires one); with keyFile. */
  readonly certFile?: string;
  /** PEM private key of certFile. */
  readonly keyFile?: string;
}

/** The contents of the files BrokerTlsOptions names. */
export interface TlsMaterial {
  readonly ca?: Buffer;
  readonly cert?: Buffer;
  readonly key?: Buffer;
}

function readPem(key: string, path: string, source: string): Buffer {
  try {
    return readFileSync(path);
  } catch (err) {
    throw new ConfigError(`${source}.${key}: cannot read ${path}: ${(err as Error).message}`, { cause: err });
  }
}

/**
 * Reads the files of `tls` now. Throws a ConfigError naming the key (under `source`) for a
 * file that cannot be read, a certificate without its key (or the other way round), or a
 * key that does not belong to the certificate.
 */
export function readTlsMaterial(tls: BrokerTlsOptions, source = "execserver.tls"): TlsMaterial {
  if ((tls.certFile === undefined) !== (tls.keyFile === undefined)) {
    const missing = tls.certFile === undefined ? "certFile" : "keyFile";
    throw new ConfigError(`${source}.${missing}: required with ${missing === "certFile" ? "keyFile" : "certFile"} (a client certificate needs both)`);
  }
  const ca = tls.caFile === undefined ? undefined : readPem("caFile", tls.caFile, source);
  const cert = tls.certFile === undefined ? undefined : readPem("certFile", tls.certFile, source);
  const key = tls.keyFile === undefined ? undefined : readPem("keyFile", tls.keyFile, source);
  try {
    createSecureContext({ ...(ca ? { ca } : {}), ...(cert && key ? { cert, key } : {}) });
  } catch (err) {
    const which = cert && /key|cert|PEM/i.test((err as Error).message) ? "certFile/keyFile" : "caFile";
    throw new ConfigError(`${source}.${which}: not usable: ${(err as Error).message}`, { cause: err });
  }
  return { ca, cert, key };
}

// The last usable material per set of files: a renewed certificate (cert-manager rewrites
// a mounted Secret's files) is picked up by the next connection, and files caught
// mid-rotation (one rewritten, the other not yet, or briefly missing) fall back to what
// worked before instead of failing the connection.
const lastGood = new Map<string, TlsMaterial>();

/** readTlsMaterial, or the last material these files gave when they cannot be used right now. */
export function currentTlsMaterial(tls: BrokerTlsOptions): TlsMaterial {
  const files = JSON.stringify([tls.caFile, tls.certFile, tls.keyFile]);
  try {
    const material = readTlsMaterial(tls);
    lastGood.set(files, material);
    return material;
  } catch (err) {
    const previous = lastGood.get(files);
    if (previous) return previous;
    throw err;
  }
}

/** Channel credentials: plaintext, or TLS with the configured CA and client certificate (files read now). */
export function channelCredentials(tls: BrokerTlsOptions | undefined): grpc.ChannelCredentials {
  if (!tls) return grpc.credentials.createInsecure();
  const { ca, cert, key } = currentTlsMaterial(tls);
  return grpc.credentials.createSsl(ca ?? null, key ?? null, cert ?? null);
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
