/**
 * Deadlines on HTTP connections, the timing half of HttpLimits: a request body must keep
 * up a minimum rate (BodyDeadlines, every HTTP listener), and a connection a server did not
 * accept itself must send its headers in time and may not idle forever
 * (ConnectionDeadlines).
 */
import type * as http from "node:http";
import * as http2 from "node:http2";
import type * as net from "node:net";
import type { HttpLimits } from "./http-limits.js";
import { LogBudget, silentLogger, type Logger } from "./log.js";

/** How fast a request body must arrive (HttpLimits / ConnectionLimits carry these). */
export interface BodyLimits {
  /** Credit a body starts with and can hold at most, in ms (default 30 s). */
  readonly bodyTimeoutMs: number;
  /** Bytes per second that earn one second of credit; 0: the whole body within bodyTimeoutMs. */
  readonly bodyMinRate: number;
}

type AnyRequest = http.IncomingMessage | http2.Http2ServerRequest;
type AnyResponse = http.ServerResponse | http2.Http2ServerResponse;

const trusted = new WeakSet<object>();

/**
 * The route knows who sends this body and that its pace is legitimate: a pipe upload (the
 * pipe id is the credential; stdout arrives as the command writes it) or a legacy job's
 * stdin (its token holds a slot). Its body is not timed from now on.
 */
export function trustBody(req: object): void {
  trusted.add(req);
}

// Credit is settled at most every second (more often for short bodyTimeouts).
const TICK_MAX_MS = 1_000;

/**
 * Deadlines for request bodies, a token bucket per body: it starts with `bodyTimeoutMs`
 * of credit, loses it as time passes, earns one second per `bodyMinRate` bytes received,
 * and never holds more than `bodyTimeoutMs`. A body whose credit runs out is cut: the
 * client gets 408 on HTTP/1.1 (when nothing was answered yet) and the connection closes;
 * on HTTP/2 the stream is reset. So a trickling body is cut within `bodyTimeoutMs`, one
 * that stalls after a fast start too, and an upload of any size that keeps up at least
 * `bodyMinRate` never is. While the server does not read (backpressure) no credit is lost.
 */
export class BodyDeadlines {
  // A crowd of slow clients must not flood the log either.
  private readonly cutLog = new LogBudget(10, 10_000);

  constructor(
    private readonly limits: BodyLimits,
    private readonly logger: Logger = silentLogger,
  ) {}

  /** Starts timing `req`'s body, if it has one; with `waitsForContinue`, from the 100 Continue on. */
  watch(req: AnyRequest, res: AnyResponse, waitsForContinue = false): void {
    if (!hasBody(req)) return;
    if (!waitsForContinue) return this.start(req, res);
    const original = res.writeContinue.bind(res);
    res.writeContinue = () => {
      res.writeContinue = original;
      original();
      this.start(req, res);
    };
  }

  // Timing starts one turn of the event loop later: a small body (a Submit) that came with
  // its headers is complete by then (Node parses it after the handler ran), and needs no
  // timer and no 'close' listener on a keep-alive socket that serves thousands of them.
  private start(req: AnyRequest, res: AnyResponse): void {
    setImmediate(() => {
      if (!req.complete && !req.socket?.destroyed) this.time(req, res);
    });
  }

  private time(req: AnyRequest, res: AnyResponse): void {
    const { bodyTimeoutMs, bodyMinRate } = this.limits;
    const stream = "stream" in req ? req.stream : undefined;
    const socket = req.socket;
    // HTTP/1.1: one request at a time per socket, so the socket's count is this body's.
    // HTTP/2: the stream's bytes as they arrive, read or not (a 'data' listener would start
    // the flow before the handler reads, and the compatibility request would miss them).
    let received = 0;
    if (stream) {
      const push = stream.push.bind(stream);
      stream.push = (chunk: unknown, encoding?: BufferEncoding): boolean => {
        if (chunk instanceof Uint8Array) received += chunk.byteLength;
        return push(chunk, encoding);
      };
    }
    let seen = stream ? 0 : socket.bytesRead;
    let credit = bodyTimeoutMs;
    let last = performance.now();
    const tickMs = Math.max(10, Math.min(TICK_MAX_MS, bodyTimeoutMs / 5));
    // Timed until the body is complete, not until the answer: a handler may answer early
    // (404, 401) while the client goes on trickling the body Node then reads to discard.
    const carrier: net.Socket | http2.ServerHttp2Stream = stream ?? socket;
    // The request's own close, not the keep-alive socket's: a listener per body on a socket
    // that serves thousands of requests piled up until each timer's next tick.
    const closer: http.IncomingMessage | http2.ServerHttp2Stream = stream ?? (req as http.IncomingMessage);
    const stop = (): void => {
      clearInterval(timer);
      // The instance's own push goes; the prototype's shows through again.
      if (stream) Reflect.deleteProperty(stream, "push");
      closer.off("close", stop);
    };
    const serverBusy = (): boolean =>
      carrier.isPaused() || req.readableLength >= req.readableHighWaterMark || (stream !== undefined && stream.readableLength >= stream.readableHighWaterMark);
    const timer = setInterval(() => {
      if (req.complete || trusted.has(req) || carrier.destroyed) return stop();
      const now = performance.now();
      const elapsed = now - last;
      last = now;
      const total = stream ? received : socket.bytesRead;
      const arrived = total - seen;
      seen = total;
      // The server is not reading (its buffer is full): waiting on us is not the client's fault.
      if (serverBusy()) {
        credit = bodyTimeoutMs;
        return;
      }
      credit = Math.min(bodyTimeoutMs, credit - elapsed + (bodyMinRate > 0 ? (arrived * 1000) / bodyMinRate : 0));
      if (credit > 0) return;
      stop();
      const left = this.cutLog.take();
      if (left !== undefined) {
        const path = (req.url ?? "").slice(0, 200);
        this.logger.info({ path, peer: socket.remoteAddress, notLogged: left || undefined }, "request body too slow: connection cut");
      }
      cut(req, res, bodyTimeoutMs, bodyMinRate);
    }, tickMs);
    timer.unref();
    closer.once("close", stop);
  }
}

/** True when the request announces a body (HTTP/1.1 length or chunking; HTTP/2 no END_STREAM on its headers). */
function hasBody(req: AnyRequest): boolean {
  if ("stream" in req) return !req.stream.endAfterHeaders;
  const length = req.headers["content-length"];
  return (length !== undefined && length !== "0") || req.headers["transfer-encoding"] !== undefined;
}

function cut(req: AnyRequest, res: AnyResponse, bodyTimeoutMs: number, bodyMinRate: number): void {
  const message =
    bodyMinRate > 0
      ? `request body too slow: it must keep up ${bodyMinRate} bytes/s, with ${bodyTimeoutMs} ms of slack\n`
      : `request body too slow: it must arrive within ${bodyTimeoutMs} ms\n`;
  if ("stream" in req) {
    // Resetting the stream, not answering: a handler may still be about to write its own answer.
    req.stream.close(http2.constants.NGHTTP2_CANCEL);
    return;
  }
  const socket = req.socket;
  // Written on the socket itself: the handler's response object stays untouched, and its
  // later writes meet a closed connection like after any client that went away.
  if (!res.headersSent && socket.writable) {
    const head = `HTTP/1.1 408 Request Timeout\r\ncontent-type: text/plain\r\ncontent-length: ${Buffer.byteLength(message)}\r\nconnection: close\r\n\r\n`;
    socket.end(head + message, () => socket.destroy());
    // A client that never reads its answer must not keep the socket.
    setTimeout(() => socket.destroy(), 1_000).unref();
  } else {
    socket.destroy();
  }
}

/**
 * Header and idle deadlines for HTTP/1.1 connections a server did not accept itself (a
 * socket handed to `http.Server` by `emit("connection")` gets none of Node's own). A
 * connection must complete a request's headers within `headersTimeoutMs` of its first
 * byte, and may sit idle between requests for `idleTimeoutMs`; otherwise it is destroyed.
 * A request in flight is not timed here: pipe uploads and long polls may take hours.
 */
export class ConnectionDeadlines {
  readonly #timers = new Map<net.Socket, NodeJS.Timeout>();
  readonly #busy = new Map<net.Socket, number>();

  constructor(private readonly limits: Pick<HttpLimits, "headersTimeoutMs" | "idleTimeoutMs">) {}

  /** A new connection: its first request's headers are due. */
  opened(socket: net.Socket): void {
    this.#busy.set(socket, 0);
    this.#arm(socket, this.limits.headersTimeoutMs, "headers");
    socket.once("close", () => {
      clearTimeout(this.#timers.get(socket));
      this.#timers.delete(socket);
      this.#busy.delete(socket);
    });
  }

  /** A request's headers arrived: no deadline while it is in flight. */
  requestStarted(socket: net.Socket): void {
    this.#busy.set(socket, (this.#busy.get(socket) ?? 0) + 1);
    clearTimeout(this.#timers.get(socket));
    this.#timers.delete(socket);
  }

  /** A response ended; once none is in flight, the idle deadline runs, then the next headers'. */
  requestEnded(socket: net.Socket): void {
    if (!this.#busy.has(socket)) return;
    const left = Math.max(0, (this.#busy.get(socket) ?? 1) - 1);
    this.#busy.set(socket, left);
    if (left > 0 || socket.destroyed) return;
    this.#arm(socket, this.limits.idleTimeoutMs, "idle");
    socket.once("data", () => {
      if (this.#busy.get(socket) === 0 && this.#timers.has(socket)) this.#arm(socket, this.limits.headersTimeoutMs, "headers");
    });
  }

  #arm(socket: net.Socket, ms: number, _why: "headers" | "idle"): void {
    clearTimeout(this.#timers.get(socket));
    const timer = setTimeout(() => {
      this.#timers.delete(socket);
      socket.destroy();
    }, ms);
    timer.unref();
    this.#timers.set(socket, timer);
  }
}
