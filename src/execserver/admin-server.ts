import { createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import { splitHostPort } from "../shared/config.js";
import type { Logger } from "../shared/log.js";

/** Answers one admin request; may be async. */
export type AdminHandler = (request: IncomingMessage, response: ServerResponse) => void | Promise<void>;

/**
 * The execserver's HTTP/1.1 admin listener: a plain path → handler table, so other
 * components (the status page) add routes with `route()` instead of editing a switch.
 */
export class AdminServer {
  private readonly routes = new Map<string, AdminHandler>();
  private readonly prefixes: { readonly prefix: string; readonly handler: AdminHandler }[] = [];
  private readonly server: Server;
  private closing: Promise<void> | undefined;

  constructor(private readonly logger: Logger) {
    this.server = createServer((request, response) => this.dispatch(request, response));
  }

  /** Adds or replaces the handler for an exact path (query strings are ignored). */
  route(path: string, handler: AdminHandler): this {
    this.routes.set(path, handler);
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
    Promise.resolve()
      .then(() => handler(request, response))
      .catch((err: unknown) => {
        this.logger.error({ err, path }, "admin handler failed");
        if (!response.headersSent) response.writeHead(500, { "content-type": "text/plain" });
        response.end("internal error\n");
      });
  }
}
