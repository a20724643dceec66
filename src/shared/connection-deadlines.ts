import type * as net from "node:net";
import type { HttpLimits } from "./http-limits.js";

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
