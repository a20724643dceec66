import * as http from "node:http";
import * as http2 from "node:http2";
import * as net from "node:net";
import * as tls from "node:tls";
import type { ConnectRouter } from "@connectrpc/connect";
import { splitHostPort } from "../../shared/config-parsing.js";
import { BodyDeadlines, ConnectionDeadlines } from "../../shared/http-deadlines.js";
import { ConfigError } from "../../shared/errors.js";
import { defaultHttpLimits, type HttpLimits } from "../../shared/http-limits.js";
import { LogBudget, silentLogger, type Logger } from "../../shared/log.js";
import type { PipeRegistry } from "../pipes/index.js";
import type { AccessControl, AccessRefusal, HttpRequest, HttpResponse, RawRoute } from "./http-types.js";
import { connectAdapter, tooLargeMessage } from "./connect-adapter.js";
import { answerUnknownRoute, registerIntrospection } from "./introspection.js";
import { nodeRequestContext } from "./node-request.js";
import { pipeRawRoutes } from "./pipe-routes.js";
import { registerPipeService } from "./pipe-service.js";
import { sniffProtocol, type WireProtocol } from "./protocol-sniff.js";
import { answerRefusal } from "./refusal.js";
import { matchPath } from "./route-match.js";
import { sendJson, sendText } from "./responses.js";
import { urlHost } from "./pipe-urls.js";

/** What `/healthz` reports; a failing check answers 503. */
export interface HealthReport {
  readonly ok: boolean;
  readonly detail?: string;
}

/** Options of the fylr's HTTP server. */
export interface FylrHttpServerOptions {
  /** "host:port" to listen on; port 0 picks a free port. */
  readonly listen: string;
  /** When given, PipeService and the raw pipe routes serve its pipes. */
  readonly registry?: PipeRegistry;
  /** Adds more Connect services (e.g. QueueService). */
  readonly connectRoutes?: (router: ConnectRouter) => void;
  /** More raw routes (status page, /metrics); matched before Connect, in order. */
  readonly rawRoutes?: readonly RawRoute[];
  /**
   * Who may use what: raw routes with a `scope`, and the procedures in `procedureScopes`,
   * are refused (before their body is read) to callers without that scope. Without it,
   * everything is open.
   */
  readonly access?: AccessControl;
  /** Request path of a Connect procedure ("/pkg.Service/Method") → the scope it needs. */
  readonly procedureScopes?: ReadonlyMap<string, string>;
  /**
   * TLS on the port (ALPN h2 and http/1.1). With `ca`, clients are asked for a certificate
   * signed by it; one without (an execserver fetching a pipe) is still served, and
   * `access` decides what a certificate is worth.
   */
  readonly tls?: ServerTls;
  /** Extra health check behind `/healthz`. */
  readonly health?: () => HealthReport;
  /** Graceful close waits this long for in-flight requests before destroying them (default 10 s). */
  readonly closeTimeoutMs?: number;
  /** A connection must show its first bytes within this time (default: the headers deadline). */
  readonly firstBytesTimeoutMs?: number;
  /** Header/idle deadlines, the connection cap and the request message cap (defaults: defaultHttpLimits). */
  readonly limits?: HttpLimits;
  readonly logger?: Logger;
}

/** The PEM files of the port's TLS, as read. */
export interface ServerTls {
  readonly cert: Buffer;
  readonly key: Buffer;
  /** CA certificates client certificates must chain to. */
  readonly ca?: Buffer;
}

/** A running fylr HTTP server. */
export interface FylrHttpServer {
  /** The bound port (the real one when listening on port 0). */
  readonly port: number;
  /** The bound host as configured, e.g. "127.0.0.1". */
  readonly address: string;
  /** "http://host:port" ("https://" with TLS), for clients and tests. */
  readonly url: string;
  /**
   * Stops accepting, lets in-flight requests finish within `closeTimeoutMs`, then
   * destroys what is left. Idempotent: every call returns the same promise.
   */
  close(): Promise<void>;
}

type ServerState = "listening" | "closing" | "closed";

// Big HTTP/2 flow-control windows: the default 64 KiB caps a pipe upload at one window
// per round trip.
const H2_WINDOW = 8 * 1024 * 1024;

/**
 * Starts the fylr's one HTTP port: HTTP/1.1 and cleartext HTTP/2 (prior knowledge) on
 * the same listener, told apart by the connection's first bytes. Serves `/healthz`, the
 * raw routes, then Connect (PipeService when a registry is given, plus `connectRoutes`,
 * plus gRPC health and reflection for them); anything else answers UNIMPLEMENTED or 404.
 */
export async function startFylrHttpServer(options: FylrHttpServerOptions): Promise<FylrHttpServer> {
  const where = splitHostPort(options.listen);
  if (!where) throw new ConfigError(`listen: expected "host:port", got "${options.listen}"`);
  const logger = (options.logger ?? silentLogger).child({ component: "fylr-http" });
  const limits = options.limits ?? defaultHttpLimits;
  const deadlines = new ConnectionDeadlines(limits);
  const bodies = new BodyDeadlines(limits, logger);
  let state: ServerState = "listening";
  const setState = (next: ServerState): void => {
    const allowed: Record<ServerState, ServerState[]> = { listening: ["closing"], closing: ["closed"], closed: [] };
    if (!allowed[state].includes(next)) throw new Error(`illegal http server transition ${state} → ${next}`);
    state = next;
  };

  const registry = options.registry;
  const routes: RawRoute[] = [
    healthRoute(() => (state === "listening" ? (options.health?.() ?? { ok: true }) : { ok: false, detail: "closing" })),
    livenessRoute(),
    ...(registry ? pipeRawRoutes(registry) : []),
    ...(options.rawRoutes ?? []),
  ];
  // Aborted when closing begins: gRPC health Watch streams say NOT_SERVING and end.
  const closingSignal = new AbortController();
  const connectHandler = connectAdapter({
    routes: (router) => {
      if (registry) registerPipeService(router, registry);
      options.connectRoutes?.(router);
      registerIntrospection(router, { serving: () => state === "listening" && (options.health?.().ok ?? true), closing: closingSignal.signal });
    },
    router: {
      // A typo in a JSON request is an error naming the field, not a silently dropped value.
      jsonOptions: { ignoreUnknownFields: false },
      // Per message: a unary request's whole body, one message of a stream. The store's
      // upload route is a raw route with its own limits, so it is not capped here.
      readMaxBytes: limits.maxRequestBytes,
      // Answers are compressed only from 16 KiB (Connect's default: 1 KiB): gzipping an item
      // of a few KiB costs more CPU than the bytes it saves on the networks fylrs serve.
      compressMinBytes: 16 * 1024,
    },
    contextValues: (req) => nodeRequestContext(req),
    fallback: (req, res) => answerUnknownRoute(req, res),
    logger,
  });

  const access = options.access;
  const refusals = new LogBudget();
  // True when the caller may go on; otherwise the refusal is answered (and logged, a few per 10 s).
  const admitted = (req: HttpRequest, res: HttpResponse, scope: string | undefined): boolean => {
    if (!access || scope === undefined) return true;
    const refusal: AccessRefusal | undefined = access.check(req, scope);
    if (!refusal) return true;
    const notLogged = refusals.take();
    if (notLogged !== undefined) logger.info({ path: req.url, peer: req.socket?.remoteAddress, code: refusal.code, reason: refusal.message, notLogged }, "api call refused");
    answerRefusal(req, res, refusal, limits.maxRequestBytes);
    return false;
  };

  const dispatch = (req: HttpRequest, res: HttpResponse, expectContinue: boolean): void => {
    bodies.watch(req, res, expectContinue);
    // While closing, HTTP/1.1 connections are told to go away after this response.
    if (state !== "listening" && !("stream" in res)) res.setHeader("connection", "close");
    const path = req.url ?? "/";
    for (const route of routes) {
      const params = matchPath(route.path, path);
      if (!params) continue;
      if (!admitted(req, res, route.scope)) return;
      const method = req.method ?? "";
      if (!route.methods.includes(method)) {
        sendText(res, 405, `method ${method} is not allowed here; use ${route.methods.join(", ")}`, {
          allow: route.methods.join(", "),
        });
        return;
      }
      if (expectContinue && !route.handlesContinue) res.writeContinue();
      runRoute(route, { req, res, params, expectContinue, logger }, logger);
      return;
    }
    if (!admitted(req, res, options.procedureScopes?.get(path.split("?", 1)[0]!))) return;
    if (expectContinue && unaryBodyOverLimit(req, limits.maxRequestBytes)) {
      // Refused instead of "100 Continue": the client never sends the body. After a 100,
      // a client still sending when the 413 came and the connection closed saw a broken
      // pipe instead of the answer.
      sendJson(res, 413, { code: "resource_exhausted", message: tooLargeMessage(String(limits.maxRequestBytes)) }, { connection: "close" });
      return;
    }
    if (expectContinue) res.writeContinue();
    connectHandler(req, res);
  };

  // Requests in flight per HTTP/1.1 socket. h1 never listens itself (sockets are handed to
  // it after sniffing), so Node's own connection tracking behind closeIdleConnections() is
  // never set up: idle keep-alive sockets are found and closed here instead.
  const h1Busy = new Map<net.Socket, number>();
  const h1Track = (req: http.IncomingMessage, res: http.ServerResponse): void => {
    const socket = req.socket;
    h1Busy.set(socket, (h1Busy.get(socket) ?? 0) + 1);
    deadlines.requestStarted(socket);
    res.once("close", () => {
      deadlines.requestEnded(socket);
      const left = (h1Busy.get(socket) ?? 1) - 1;
      h1Busy.set(socket, left);
      // A request that was in flight when closing began leaves an idle keep-alive socket.
      if (left === 0 && state !== "listening") socket.end();
    });
  };
  const h1 = http.createServer({ requestTimeout: 0 }, (req, res) => {
    h1Track(req, res);
    dispatch(req, res, false);
  });
  h1.on("checkContinue", (req, res) => {
    h1Track(req, res);
    dispatch(req, res, true);
  });
  const h2 = http2.createServer({ settings: { initialWindowSize: H2_WINDOW, maxConcurrentStreams: 10_000 } }, (req, res) => dispatch(req, res, false));
  h2.on("checkContinue", (req, res) => dispatch(req, res, true));

  const sockets = new Map<net.Socket, WireProtocol | "sniffing">();
  const sessions = new Set<http2.ServerHttp2Session>();
  h2.on("session", (session) => {
    sessions.add(session);
    session.once("close", () => sessions.delete(session));
    session.on("error", (err: Error) => logger.debug({ err: err.message }, "http/2 session error"));
    session.setLocalWindowSize(H2_WINDOW);
    // An HTTP/2 connection with no stream open and no traffic for idleTimeout is closed.
    let open = 0;
    session.on("stream", (stream: http2.ServerHttp2Stream) => {
      open++;
      stream.once("close", () => open--);
    });
    session.setTimeout(limits.idleTimeoutMs, () => {
      if (open === 0) session.close();
    });
  });
  h2.on("sessionError", (err: Error) => logger.debug({ err: err.message }, "http/2 session error"));
  h1.on("clientError", (err, socket) => {
    logger.debug({ err: err.message }, "http/1.1 client error");
    if (socket.writable) socket.end("HTTP/1.1 400 Bad Request\r\nconnection: close\r\n\r\n");
    else socket.destroy();
  });

  const accept = (socket: net.Socket): void => {
    // A TLS handshake that ends after closing began finds no server to serve it.
    if (state !== "listening") return void socket.destroy();
    sockets.set(socket, "sniffing");
    socket.once("close", () => {
      sockets.delete(socket);
      h1Busy.delete(socket);
    });
    // A connection that sends nothing at all is a slow-header client too.
    sniffProtocol(socket, firstBytesMs, (protocol) => {
      // Node's HTTP/2 server takes a TLS connection only when ALPN chose h2.
      if (protocol === "h2" && socket instanceof tls.TLSSocket && socket.alpnProtocol !== "h2") return void socket.destroy();
      sockets.set(socket, protocol);
      if (protocol === "h2") {
        h2.emit("connection", socket);
      } else {
        deadlines.opened(socket);
        h1.emit("connection", socket);
        socket.resume();
      }
    });
  };
  const firstBytesMs = options.firstBytesTimeoutMs ?? limits.headersTimeoutMs;
  const listener = options.tls ? tlsListener(options.tls, firstBytesMs, accept, logger) : net.createServer(accept);
  // Past the cap new connections are closed at once; those open keep being served.
  listener.maxConnections = limits.maxConnections;
  await new Promise<void>((resolve, reject) => {
    listener.once("error", reject);
    listener.listen(where.port, where.host, () => {
      listener.off("error", reject);
      resolve();
    });
  });
  listener.on("error", (err: Error) => logger.error({ err: err.message }, "listener error"));
  const port = (listener.address() as net.AddressInfo).port;
  logger.info({ host: where.host, port, tls: !!options.tls, clientCertificates: !!options.tls?.ca }, "fylr http listening");

  let closing: Promise<void> | undefined;
  const close = (): Promise<void> => {
    closing ??= (async () => {
      setState("closing");
      closingSignal.abort();
      listener.close();
      for (const [socket, protocol] of sockets) if (protocol === "sniffing") socket.destroy();
      for (const [socket, protocol] of sockets) if (protocol === "h1" && !h1Busy.get(socket)) socket.destroy();
      for (const session of sessions) session.close();
      const drained = await waitUntil(() => sockets.size === 0, options.closeTimeoutMs ?? 10_000);
      if (!drained) {
        logger.warn({ connections: sockets.size }, "graceful close timed out; destroying connections");
        for (const session of sessions) session.destroy();
        for (const socket of sockets.keys()) socket.destroy();
        // Resolve only once the destroyed sockets have closed, so every request's
        // 'close' handling (aborting its pipe) has run when close() returns.
        await waitUntil(() => sockets.size === 0, 5_000);
      }
      setState("closed");
    })();
    return closing;
  };

  return { port, address: where.host, url: `${options.tls ? "https" : "http"}://${urlHost(where.host)}:${port}`, close };
}

// TLS first, then the same sniffing as cleartext on the decrypted stream. ALPN offers h2
// and http/1.1, so gRPC clients (which insist on h2), Connect and curl all find theirs.
function tlsListener(options: ServerTls, handshakeMs: number, accept: (socket: net.Socket) => void, logger: Logger): tls.Server {
  const server = tls.createServer(
    {
      cert: options.cert,
      key: options.key,
      ALPNProtocols: ["h2", "http/1.1"],
      handshakeTimeout: handshakeMs,
      ...(options.ca && { ca: options.ca, requestCert: true, rejectUnauthorized: false }),
    },
    accept,
  );
  server.on("tlsClientError", (err: Error) => logger.debug({ err: err.message }, "tls handshake failed"));
  return server;
}

function healthRoute(report: () => HealthReport): RawRoute {
  return {
    path: "/healthz",
    methods: ["GET", "HEAD"],
    handle: ({ res }) => {
      const { ok, detail } = report();
      sendText(res, ok ? 200 : 503, detail ?? (ok ? "ok" : "unhealthy"));
    },
  };
}

// /livez: the process answers. Stays 200 while stopping (unlike /healthz), so a liveness
// probe never kills a fylr that is finishing its items.
function livenessRoute(): RawRoute {
  return { path: "/livez", methods: ["GET", "HEAD"], handle: ({ res }) => sendText(res, 200, "alive") };
}

function runRoute(route: RawRoute, call: Parameters<RawRoute["handle"]>[0], logger: Logger): void {
  const fail = (err: unknown): void => {
    logger.error({ err: (err as Error).message, path: route.path }, "raw route failed");
    if (!call.res.headersSent) sendText(call.res, 500, "internal error");
    else call.res.destroy();
  };
  try {
    const result = route.handle(call);
    if (result) result.catch(fail);
  } catch (err) {
    fail(err);
  }
}

// Polls instead of counting events: sockets close through several paths (h1 keep-alive
// end, GOAWAY, destroy) and polling a size is simpler than wiring each of them.
async function waitUntil(done: () => boolean, timeoutMs: number): Promise<boolean> {
  const deadline = Date.now() + timeoutMs;
  while (!done()) {
    if (Date.now() >= deadline) return false;
    await new Promise((resolve) => setTimeout(resolve, 10));
  }
  return true;
}

/** A Connect unary call (JSON or binary) that says it brings more than `limit` bytes. */
function unaryBodyOverLimit(req: HttpRequest, limit: number): boolean {
  const contentType = String(req.headers["content-type"] ?? "").toLowerCase();
  if (!contentType.startsWith("application/json") && !contentType.startsWith("application/proto")) return false;
  return Number(req.headers["content-length"] ?? 0) > limit;
}
