/**
 * One execserver process, assembled: the engine (gRPC + admin listeners) with its admin
 * routes — /healthz, /metrics, /status.json and the live status page. Loads no database
 * code: an exec host never needs it (a test checks the module graph).
 */
import { toJson } from "@bufbuild/protobuf";
import { GetStatusResponseSchema, type GetStatusResponse } from "../../gen/slotbroker/v1/broker_pb.js";
import { Execserver, type AdminHandler, type AdminServer, type ExecserverConfig, type ExecserverState, type RunJob } from "../execserver/index.js";
import { silentLogger, type Logger } from "../shared/log.js";
import { execStatusPageRoutes } from "../status-pages/index.js";

/** Dependencies of startExecserver. */
export interface StartExecserverOptions {
  /** Parent logger (default: silent). */
  readonly logger?: Logger;
  /** Runs command services (default: the process runner in ./runner). */
  readonly runJob?: RunJob;
  /** Hello broadcast coalescing window (default 100 ms; bounds the Hello fan-out that connection churn can cause). */
  readonly helloCoalesceMs?: number;
  /** HELLO frames per second a run of changes may cost (see ExecserverOptions). */
  readonly helloFramesPerSecond?: number;
}

/** A running execserver. */
export interface ExecserverHandle {
  readonly instanceId: string;
  /** The bound gRPC port (useful with port 0); 0 in legacy-only mode. */
  readonly grpcPort: number;
  /** The bound admin HTTP port. */
  readonly adminPort: number;
  /** "host:port" to dial for gRPC; "" in legacy-only mode. */
  readonly grpcAddress: string;
  /** "http://host:port" of the legacy token protocol; undefined when it is off. */
  readonly legacyUrl: string | undefined;
  /** "http://host:port" of the admin listener. */
  readonly adminUrl: string;
  /** The admin listener, to add routes (e.g. a status page). */
  readonly admin: AdminServer;
  /** The server itself (state, broker, metrics) for in-process callers and tests. */
  readonly server: Execserver;
  /** Lifecycle state. */
  readonly state: ExecserverState;
  /** The GetStatus snapshot. */
  status(): GetStatusResponse;
  /** Graceful shutdown (drain, then stop); idempotent. */
  close(): Promise<void>;
  /** Forceful shutdown (abort jobs, drop streams); idempotent. */
  forceClose(): Promise<void>;
  /** close(), for `await using exec = await startExecserver(…)`. */
  [Symbol.asyncDispose](): Promise<void>;
}

/** Starts an execserver from a compiled config: gRPC + admin listeners, ready to serve. */
export async function startExecserver(config: ExecserverConfig, options: StartExecserverOptions = {}): Promise<ExecserverHandle> {
  const server = new Execserver(config, {
    logger: options.logger ?? silentLogger,
    runJob: options.runJob,
    helloCoalesceMs: options.helloCoalesceMs,
    helloFramesPerSecond: options.helloFramesPerSecond,
  });
  installAdminRoutes(server);
  await server.start();
  const host = (h: string): string => (h.startsWith("[") || !h.includes(":") ? h : `[${h}]`);
  const hostOf = (address: string): string => host(dialable(address.slice(0, address.lastIndexOf(":"))));
  const legacyListen = config.legacy?.listen;
  const legacyHost = legacyListen === "admin" ? config.adminListen : legacyListen === "listen" ? config.listen : legacyListen;
  return {
    instanceId: config.instanceId,
    grpcPort: server.grpcPort,
    adminPort: server.adminPort,
    grpcAddress: config.brokerService ? `${hostOf(config.listen)}:${server.grpcPort}` : "",
    legacyUrl: legacyHost === undefined ? undefined : `http://${hostOf(legacyHost)}:${server.legacyPort}`,
    adminUrl: `http://${hostOf(config.adminListen)}:${server.adminPort}`,
    admin: server.admin,
    server,
    get state() {
      return server.state;
    },
    status: () => server.status(),
    close: () => server.close(),
    forceClose: () => server.forceClose(),
    [Symbol.asyncDispose]: () => server.close(),
  };
}

// A wildcard listen address is not something to dial; loopback reaches it.
function dialable(host: string): string {
  if (host === "0.0.0.0") return "127.0.0.1";
  if (host === "[::]" || host === "::") return "[::1]";
  return host;
}

function installAdminRoutes(server: Execserver): void {
  const ready: AdminHandler = (_req, res) => {
    const ok = server.state === "serving";
    res.writeHead(ok ? 200 : 503, { "content-type": "text/plain" }).end(ok ? "ok\n" : `${server.state}\n`);
  };
  server.admin
    .route("/healthz", ready)
    // The same as /healthz, under the name the fylr's readiness has: an execserver is ready
    // while it serves (not draining); it depends on nothing else.
    .route("/readyz", ready)
    // Answers while the process does, draining included: a liveness probe must not kill a drain.
    .route("/livez", (_req, res) => {
      res.writeHead(200, { "content-type": "text/plain" }).end("alive\n");
    })
    .route("/metrics", async (_req, res) => {
      const body = await server.metrics.render();
      res.writeHead(200, { "content-type": server.metrics.registry.contentType }).end(body);
    })
    .route(
      "/status.json",
      (_req, res) => {
        const json = toJson(GetStatusResponseSchema, server.status());
        res.writeHead(200, { "content-type": "application/json" }).end(`${JSON.stringify(json, null, 2)}\n`);
      },
      { requiresToken: true },
    );
  // The live status page: "/", "/status" and the view JSON it polls (connection details: token).
  for (const { path, handler } of execStatusPageRoutes(() => server.status())) server.admin.route(path, handler, { requiresToken: true });
}
