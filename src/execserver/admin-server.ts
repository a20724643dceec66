import { createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import { BodyDeadlines } from "../shared/http-deadlines.js";
import { splitHostPort } from "../shared/config-parsing.js";
import { defaultConnectionLimits, type ConnectionLimits } from "../shared/http-limits.js";
import type { Logger } from "../shared/log.js";
import type { BearerAuth } from "./auth.js";

/** Answers one admin request; may be async. */
export type AdminHandler = (request: IncomingMessage, response: ServerResponse) => void | Promise<void>;

/**
 * The execserver's HTTP/1.1 admin listener: a plain path → handler table, so other
 * components (the status page) add routes with `route()` instead of editing a switch.
 */
/** Options of an admin listener. */
export interface AdminServerOptions {
  /** Checks the bearer token of routes added with `{ requiresToken: true }` (auth off: everything open). */
  readonly auth?: BearerAuth;
  /** Header/idle deadlines and the connection cap (defaults: defaultConnectionLimits). */
  readonly limits?: ConnectionLimits;
}

export class AdminServer {
  private readonly routes = new Map<string, AdminHandler>();
  private readonly protectedPaths = new Set<string>();
  private readonly prefixes: { readonly prefix: string; readonly handler: AdminHandler }[] = [];
  private readonly server: Server;
  private readonly bodies: BodyDeadlines;
  private closing: Promise<void> | undefined;

  constructor(
    private readonly logger: Logger,
    private readonly options: AdminServerOptions = {},
  ) {
    const limits = options.limits ?? defaultConnectionLimits;
    this.bodies = new BodyDeadlines(limits, logger);
    // No request timeout: a legacy PUT /job body is a job's stdin and may stream for hours
    // (it is trusted once its token is redeemed); other bodies are timed by BodyDeadlines.
    this.server = createServer(
      {
        headersTimeout: limits.headersTimeoutMs,
        requestTimeout: 0,
        keepAliveTimeout: limits.idleTimeoutMs,
        // How often Node looks for connections past their header deadline.
        connectionsCheckingInterval: Math.max(250, Math.min(30_000, limits.headersTimeoutMs / 4)),
      },
      (request, response) => {
        this.bodies.watch(request, response);
        this.dispatch(request, response);
      },
    );

    this.server.maxConnections = limits.maxConnections;
  }

  /**
   * Adds or replaces the handler for an exact path (query strings are ignored). With
   * `requiresToken`, a request must carry the execserver's bearer token when one is set:
   * connection details are for operators, like GetStatus on the gRPC port.
   */
  route(path: string, handler: AdminHandler, options: { readonly requiresToken?: boolean } = {}): this {
    this.routes.set(path, handler);
    if (options.requiresToken) this.protectedPaths.add(path);
    else this.protectedPaths.delete(path);
    return this;
  }

  /** Adds a handler for every path under `prefix` (e.g. "/token/"), after the exact routes. */
  routePrefix(prefix: string, handler: AdminHandler): this {
    this.prefixes.push({ prefix, handler });
    return this;
  }

  /** The registered paths. */
  paths(): string[] {
    return [...this.routes.keys(), ...this.prefixes.map((p) => `${p.prefix}…`)].sort();
  }

  /** Listens on "host:port"; resolves with the bound port. */
  listen(address: string): Promise<number> {
    const { host, port } = splitHostPort(address)!;
    return new Promise((resolve, reject) => {
      this.server.once("error", reject);
      this.server.listen(port, host, () => {
        this.server.off("error", reject);
        resolve((this.server.address() as AddressInfo).port);
      });
    });
  }

  /** Stops listening and closes idle and active connections. Idempotent. */
  close(): Promise<void> {
    this.closing ??= new Promise((resolve) => {
      if (!this.server.listening) return resolve();
      this.server.close(() => resolve());
      this.server.closeAllConnections();
    });
    return this.closing;
  }

  private dispatch(request: IncomingMessage, response: ServerResponse): void {
    const path = (request.url ?? "/").split("?", 1)[0]!;
    const handler = this.routes.get(path) ?? this.prefixes.find((p) => path.startsWith(p.prefix))?.handler;
    if (!handler) {
      response.writeHead(404, { "content-type": "text/plain" }).end(`not found; try ${this.paths().join(", ")}\n`);
      return;
    }
    if (this.protectedPaths.has(path) && this.options.auth && !this.options.auth.checkHeader(request.headers.authorization)) {
      response.writeHead(401, { "content-type": "text/plain", "www-authenticate": 'Bearer realm="slotbroker"' }).end(`${path}: send the execserver's token as "authorization: Bearer TOKEN"\n`);
      return;
    }
    Promise.resolve()
      .then(() => handler(request, response))
      .catch((err: unknown) => {
        this.logger.error({ err, path }, "admin handler failed");
        if (!response.headersSent) response.writeHead(500, { "content-type": "text/plain" });
        response.end("internal error\n");
      });
  }
}
