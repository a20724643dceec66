/**
 * The execserver's gRPC side: the grpc-js server with BrokerService, health and reflection
 * (createGrpcServer, at the end), and the door on its port (GrpcDoor), a listener of its
 * own that cuts connections which never finish their TLS handshake or HTTP/2 preface.
 */
import { lookup } from "node:dns/promises";
import { readFileSync } from "node:fs";
import * as net from "node:net";
import * as tls from "node:tls";
import * as grpc from "@grpc/grpc-js";
import { BrokerService, type ConnectRequest, type ConnectResponse, type GetStatusResponse } from "../../gen/slotbroker/v1/broker_pb.js";
import { splitHostPort } from "../shared/config-parsing.js";
import { ConfigError } from "../shared/errors.js";
import { addHealth, addReflection, type HealthService } from "../shared/grpc.js";
import type { Logger } from "../shared/log.js";
import type { ExecserverConfig } from "./config.js";
import { serverServiceDefinition } from "./frames.js";
import { limits } from "./limits.js";

/** The client connection preface of HTTP/2 (RFC 9113 §3.4); a SETTINGS frame follows it. */
const PREFACE = Buffer.from("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", "latin1");
const FRAME_HEADER = 9;
// SETTINGS_MAX_FRAME_SIZE's initial value: a first frame that claims more is nghttp2's to refuse.
const MAX_FIRST_FRAME = 16_384;

/**
 * Where a connection's first bytes stand: "complete" once the preface and the whole first
 * frame are there, "other" at the first byte that differs from the preface (nghttp2
 * answers that with GOAWAY at once), "partial" before.
 */
export function prefaceProgress(head: Uint8Array): "complete" | "partial" | "other" {
  const n = Math.min(head.length, PREFACE.length);
  for (let i = 0; i < n; i++) if (head[i] !== PREFACE[i]) return "other";
  if (head.length < PREFACE.length + FRAME_HEADER) return "partial";
  const length = (head[PREFACE.length]! << 16) | (head[PREFACE.length + 1]! << 8) | head[PREFACE.length + 2]!;
  if (length > MAX_FIRST_FRAME) return "other";
  return head.length >= PREFACE.length + FRAME_HEADER + length ? "complete" : "partial";
}

/** Options of the gRPC port's listener. */
export interface GrpcDoorOptions {
  /** "host:port" (port 0 picks one). */
  readonly listen: string;
  readonly tls: ExecserverConfig["tls"];
  /** A connection must finish its TLS handshake and send the preface and first frame within this. */
  readonly handshakeTimeoutMs: number;
  readonly logger: Logger;
}

/**
 * The gRPC port: its own listener in front of grpc-js (which gets each connection through
 * `createConnectionInjector`), so that a connection that never completes its TLS handshake
 * or its HTTP/2 preface is cut after `handshakeTimeoutMs`. grpc-js opens its session on
 * the first byte and lets it sit until keepalive or the idle timeout gives up on it.
 * TLS is terminated here (same certificate, key and client CA as grpc-js would use), so
 * the preface can be read; grpc-js still sees a TLS socket (peer certificate, `encrypted`).
 */
export class GrpcDoor {
  private readonly listeners: net.Server[] = [];
  // Connections whose preface is due, by remote "address:port" (a TLS socket made from an
  // accepted socket reports the same).
  private readonly waiting = new Map<string, { readonly socket: net.Socket; readonly deadline: NodeJS.Timeout }>();
  private readonly injector: ReturnType<grpc.Server["createConnectionInjector"]>;
  private readonly tlsServer: tls.Server | undefined;
  private portValue = 0;

  private constructor(
    server: grpc.Server,
    private readonly options: GrpcDoorOptions,
  ) {
    this.injector = server.createConnectionInjector(grpc.ServerCredentials.createInsecure());
    this.tlsServer = options.tls && createTlsEngine(options.tls, options.handshakeTimeoutMs);
    this.tlsServer?.on("secureConnection", (socket: tls.TLSSocket) => this.readPreface(socket));
    // Handshake failures (no client certificate, wrong protocol) close the socket; nothing to report.
    this.tlsServer?.on("tlsClientError", (err: Error) => options.logger.debug({ err: err.message }, "grpc port: TLS handshake failed"));
  }

  /** Listens on `options.listen` (every address a host name resolves to, on one port). */
  static async open(server: grpc.Server, options: GrpcDoorOptions): Promise<GrpcDoor> {
    const door = new GrpcDoor(server, options);
    try {
      await door.listen();
    } catch (err) {
      door.close();
      throw err;
    }
    return door;
  }

  /** The bound port. */
  get port(): number {
    return this.portValue;
  }

  /** Stops accepting and cuts connections still at the door; those handed to grpc-js are its. */
  close(): void {
    for (const listener of this.listeners) listener.close();
    for (const { socket, deadline } of this.waiting.values()) {
      clearTimeout(deadline);
      socket.destroy();
    }
    this.waiting.clear();
  }

  private async listen(): Promise<void> {
    const where = splitHostPort(this.options.listen);
    if (!where) throw new ConfigError(`listen: expected "host:port", got "${this.options.listen}"`);
    // As grpc-js binds: a name (e.g. localhost) on each of its addresses, the first picking the port.
    const hosts = net.isIP(where.host) ? [where.host] : [...new Set((await lookup(where.host, { all: true })).map((a) => a.address))];
    let port = where.port;
    for (const host of hosts) {
      const listener = net.createServer((socket) => this.accept(socket));
      this.listeners.push(listener);
      await new Promise<void>((resolve, reject) => {
        listener.once("error", reject);
        listener.listen(port, host, () => {
          listener.off("error", reject);
          resolve();
        });
      });
      listener.on("error", (err: Error) => this.options.logger.error({ err: err.message }, "grpc listener error"));
      port = (listener.address() as net.AddressInfo).port;
    }
    this.portValue = port;
  }

  private accept(socket: net.Socket): void {
    const peer = `${socket.remoteAddress}:${socket.remotePort}`;
    const deadline = setTimeout(() => {
      this.options.logger.debug({ peer }, "grpc port: no TLS handshake and HTTP/2 preface in time; connection closed");
      socket.destroy();
    }, this.options.handshakeTimeoutMs);
    deadline.unref();
    this.waiting.set(peer, { socket, deadline });
    socket.once("close", () => this.admitted(peer, socket));
    socket.on("error", () => socket.destroy());
    if (this.tlsServer) this.tlsServer.emit("connection", socket);
    else this.readPreface(socket);
  }

  // The deadline is met (or moot): the connection is grpc-js's now.
  private admitted(peer: string, socket?: net.Socket): void {
    const entry = this.waiting.get(peer);
    if (!entry || (socket && entry.socket !== socket)) return;
    clearTimeout(entry.deadline);
    this.waiting.delete(peer);
  }

  // Reads until the preface and the first frame are there, puts the bytes back and hands
  // the socket to grpc-js (Node's HTTP/2 session drains a socket's buffered bytes itself).
  private readPreface(socket: net.Socket): void {
    // A TLS socket reports the remote end of the socket it wraps: the key of the deadline.
    const peer = `${socket.remoteAddress}:${socket.remotePort}`;
    const parts: Buffer[] = [];
    const onData = (chunk: Buffer): void => {
      parts.push(chunk);
      const head = parts.length === 1 ? chunk : Buffer.concat(parts);
      if (prefaceProgress(head) === "partial") return;
      socket.off("data", onData);
      socket.pause();
      socket.unshift(head);
      this.admitted(peer);
      this.injector.injectConnection(socket);
    };
    socket.on("data", onData);
    if (socket instanceof tls.TLSSocket) socket.on("error", () => socket.destroy());
  }
}

// A tls.Server that never listens: accepted sockets are handed to it for the handshake,
// with the settings grpc-js's ServerCredentials.createSsl would use.
function createTlsEngine(files: NonNullable<ExecserverConfig["tls"]>, handshakeTimeoutMs: number): tls.Server {
  const read = (key: string, path: string): Buffer => {
    try {
      return readFileSync(path);
    } catch (err) {
      throw new ConfigError(`tls.${key}: cannot read ${path}: ${(err as Error).message}`, { cause: err });
    }
  };
  const cert = read("certFile", files.certFile);
  const key = read("keyFile", files.keyFile);
  const ca = files.clientCaFile === undefined ? undefined : read("clientCaFile", files.clientCaFile);
  try {
    return tls.createServer({
      cert,
      key,
      ca,
      requestCert: ca !== undefined,
      rejectUnauthorized: ca !== undefined,
      ALPNProtocols: ["h2"],
      handshakeTimeout: handshakeTimeoutMs,
    });
  } catch (err) {
    throw new ConfigError(`tls: ${(err as Error).message}`, { cause: err });
  }
}

// --- the gRPC server -----------------------------------------------------------------

/** The health service names that flip to NOT_SERVING while draining. */
export const healthServices = ["", BrokerService.typeName] as const;

/** The BrokerService calls an execserver answers. */
export interface BrokerHandlers {
  connect(call: grpc.ServerDuplexStream<ConnectRequest, ConnectResponse>): void;
  getStatus(call: grpc.ServerUnaryCall<unknown, GetStatusResponse>, callback: grpc.sendUnaryData<GetStatusResponse>): void;
}

/** The execserver's gRPC server (BrokerService, health, reflection), not yet bound. */
export function createGrpcServer(handlers: BrokerHandlers): { server: grpc.Server; health: HealthService } {
  const server = new grpc.Server({
    "grpc.max_receive_message_length": limits.maxFrameBytes,
    // A connection carries a few streams (one broker stream, status and health calls);
    // one with no stream at all for 5 minutes is closed.
    "grpc.max_concurrent_streams": 1000,
    "grpc.max_connection_idle_ms": 5 * 60_000,
    "grpc.keepalive_time_ms": 30_000,
    "grpc.keepalive_timeout_ms": 10_000,
    // Let fylrs ping every few seconds for half-open detection without a GOAWAY.
    "grpc.http2.min_ping_interval_without_data_ms": 5_000,
    // channelz stamps every message sent and received (a Date each); nothing here reads it.
    "grpc.enable_channelz": 0,
  });
  server.addService(serverServiceDefinition(), {
    connect: (call: grpc.ServerDuplexStream<ConnectRequest, ConnectResponse>) => handlers.connect(call),
    getStatus: (call: grpc.ServerUnaryCall<unknown, GetStatusResponse>, callback: grpc.sendUnaryData<GetStatusResponse>) =>
      handlers.getStatus(call, callback),
  });
  addReflection(server, [BrokerService.typeName]);
  const health = addHealth(server, Object.fromEntries(healthServices.map((s) => [s, "SERVING" as const])));
  return { server, health };
}
