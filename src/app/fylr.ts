/**
 * One fylr process, assembled: the database pool, the broker client (pools per execserver
 * address), the pipe registry, the HTTP port (pipes, QueueService, /healthz, /readyz, /metrics,
 * /status.json, extra raw routes), the exec client and the dispatcher loop.
 */
import { measuredBackend, registerQueueService, RuntimeMeans } from "../api/index.js";
import { Dispatcher, ensureDatabase, migrate, type ExecBackend, type LocalActionRegistry } from "../dispatcher/index.js";
import {
  ApiAccess,
  ApiTokens,
  BrokerClient,
  ExecClient,
  PipeRegistry,
  queueProcedureScopes,
  readServerTls,
  startFylrHttpServer,
  TokenSet,
  type FylrHttpServer,
  type RawRoute,
  type ReloadOutcome,
} from "../fylr/index.js";
import { isLoopbackHost, splitHostPort } from "../shared/config-parsing.js";
import { ConfigError } from "../shared/errors.js";
import { CleanupStack } from "../shared/cleanup.js";
import { Transitions } from "../shared/lifecycle.js";
import { silentLogger, type Logger } from "../shared/log.js";
import { brokerCapacity, execBackend } from "./exec-adapters.js";
import { ExecserverLoad } from "./execserver-status.js";
import type { FylrConfig } from "./fylr-config.js";
import { createFylrMetrics } from "./fylr-metrics.js";
import { fylrReadinessChecks, readinessRoute } from "./fylr-readiness.js";
import { metricsRoute, statusRoute } from "./fylr-routes.js";
import { createFylrStatusPage } from "./fylr-status-page.js";
import { storeRoutes } from "./store-routes.js";
import { createPgPool } from "../shared/postgres.js";

/** A fylr's lifecycle. */
export type FylrState = "running" | "stopping" | "stopped";

const transitions = new Transitions<FylrState>("fylr", { running: ["stopping"], stopping: ["stopped"], stopped: [] });

/** Options of startFylr. */
export interface StartFylrOptions {
  readonly logger?: Logger;
  /** More raw routes on the HTTP port, e.g. a status page. Matched after the built-in ones. */
  readonly rawRoutes?: readonly RawRoute[];
  /** Local actions (default: the built-ins, checksum and count). */
  readonly actions?: LocalActionRegistry;
}

/** A running fylr. */
export interface FylrHandle {
  readonly id: string;
  /** The bound HTTP port (the real one when listening on port 0). */
  readonly port: number;
  /** "http://host:port" ("https://" with tls) of QueueService and the pipes. */
  readonly url: string;
  /** "host:port" as bound. */
  readonly address: string;
  readonly dispatcher: Dispatcher;
  readonly broker: BrokerClient;
  readonly http: FylrHttpServer;
  readonly state: FylrState;
  /**
   * Reads auth.tokensFile again now (SIGHUP); calls from then on are judged by its tokens.
   * Undefined when there is no tokens file.
   */
  reloadAuth(): Promise<ReloadOutcome | undefined>;
  /**
   * Graceful: stops claiming, lets items finish within dispatcher.stopGrace (then gives the
   * rest back), closes the HTTP port, the broker and the database pool. Idempotent; a
   * CleanupError names every part that failed to close.
   */
  close(): Promise<void>;
  /** Forceful: gives running items back at once, then closes like close(). Idempotent. */
  forceClose(): Promise<void>;
  /** close(), for `await using fylr = await startFylr(…)`. */
  [Symbol.asyncDispose](): Promise<void>;
}

/** Starts a fylr from a compiled config: migrates, listens, connects, starts claiming. */
export async function startFylr(config: FylrConfig, options: StartFylrOptions = {}): Promise<FylrHandle> {
  const logger = options.logger ?? silentLogger;
  const log = logger.child({ component: "fylr", fylrId: config.id });
  if (!config.auth && !isLoopbackHost(splitHostPort(config.listen)?.host ?? config.listen)) {
    throw new ConfigError(`auth: required when listen (${config.listen}) is not a loopback address`);
  }
  const serverTls = config.tls && readServerTls(config.tls);
  // One stack for a failed start and for close(): whatever was started is stopped, last
  // first, and every step that fails is reported.
  const stack = new CleanupStack(`fylr ${config.id}`);
  // An idle client's error (a database restart) is reported by the next query; not a crash.
  const pool = createPgPool({ connectionString: config.databaseUrl, max: config.databasePoolSize }, (err) =>
    log.warn({ err: err.message }, "idle database connection failed"),
  );
  // Streams of stored data hold a connection (and a transaction) for as long as they run:
  // a pool of their own, so a busy upload never delays a heartbeat. A transaction left idle
  // by a stalled client is ended by the server.
  const blobPool = createPgPool(
    {
      connectionString: config.databaseUrl,
      max: config.store.poolSize,
      idle_in_transaction_session_timeout: config.store.stallTimeoutMs,
      application_name: `slotbroker-store ${config.id}`,
    },
    (err) => log.warn({ err: err.message }, "idle database connection of the store failed"),
  );
  stack.defer("database pool", () => pool.end());
  stack.defer("store pool", () => blobPool.end());
  try {
    await ensureDatabase(config.databaseUrl, { logger });
    await migrate(pool, { logger });
    const broker = new BrokerClient(config.broker, { logger });
    stack.defer("broker client", () => broker.close());
    const pipes = new PipeRegistry({ logger });
    stack.defer("pipes", () => pipes.close());
    const means = new RuntimeMeans();
    // The exec client needs the HTTP port, the HTTP port serves QueueService over the
    // dispatcher, and the dispatcher needs the backend: the backend resolves the client late.
    const late: { backend?: ExecBackend; http?: FylrHttpServer } = {};
    const backend = measuredBackend({ run: (request, runOptions) => late.backend!.run(request, runOptions) }, means);
    const dispatcher = new Dispatcher({
      pool,
      capacity: brokerCapacity(broker),
      backend,
      actions: options.actions,
      config: config.dispatcher,
      store: config.store,
      queue: config.queue,
      blobPool,
      logger,
      fylrId: config.id,
      migrate: false,
      // Read at start() and on re-registration, after the port is bound.
      get apiUrl() {
        return late.http?.url;
      },
    });
    const load = new ExecserverLoad(config.broker.addresses, { token: config.broker.token, tls: config.broker.tls, clientName: config.id });
    stack.defer("execserver status clients", () => load.close());
    const shutdown = new AbortController();
    const metrics = createFylrMetrics(config.id, dispatcher, broker, (service) => broker.instances().some((i) => Object.hasOwn(i.services, service)));
    // The live status page at "/" and "/status" (it follows the dispatcher's items).
    const statusPage = createFylrStatusPage({ dispatcher, broker });
    stack.defer("status page", () => statusPage.close());
    const access = config.auth && new ApiAccess(new TokenSet([]), config.auth.clients);
    const tokens = config.auth && access && (await ApiTokens.start(config.auth, (set) => access.replaceTokens(set), logger));
    if (tokens) stack.defer("api tokens", () => tokens.close());
    const http = await startFylrHttpServer({
      listen: config.listen,
      registry: pipes,
      limits: config.http,
      logger,
      closeTimeoutMs: 5000,
      tls: serverTls,
      access,
      procedureScopes: queueProcedureScopes,
      connectRoutes: (router) =>
        registerQueueService(router, {
          dispatcher,
          load,
          means,
          offeredServices: offeredServices(broker),
          allowedEnv: (service) => allowedEnv(broker, service),
          watchPollMs: config.watchPollMs,
          shutdown: shutdown.signal,
          logger,
        }),
      rawRoutes: [readinessRoute(fylrReadinessChecks(dispatcher, broker)), metricsRoute(metrics), statusRoute(dispatcher, broker), ...storeRoutes(dispatcher), ...statusPage.routes, ...(options.rawRoutes ?? [])],
      health: () => ({
        ok: dispatcher.state === "running",
        detail: dispatcher.state === "running" ? `ok (${broker.instances().length} execserver instance(s) connected)` : dispatcher.state,
      }),
    });
    late.http = http;
    stack.defer("HTTP port", () => http.close());
    // With an allow-list of stdin URL prefixes, a redirect could lead anywhere: refused.
    const followRedirects = config.dispatcher.stdinUrlPrefixes.length === 0;
    const pipeScheme = serverTls ? "https" : "http";
    late.backend = execBackend(new ExecClient({ broker, pipes, pipePort: http.port, pipeScheme, logger }), { followRedirects });
    broker.start();
    // Stopped first: running items still need the HTTP port, the pipes and the broker.
    stack.defer("dispatcher", () => dispatcher.stop());
    await dispatcher.start();
    return assemble({ config, log, stack, shutdown, dispatcher, broker, http, tokens });
  } catch (err) {
    await stack.run().catch((cleanupErr: unknown) => log.warn({ err: cleanupErr }, "cleaning up after a failed start"));
    throw err;
  }
}

interface Parts {
  readonly config: FylrConfig;
  readonly log: Logger;
  /** Stops everything startFylr started, in reverse. */
  readonly stack: CleanupStack;
  /** Aborted first on close: open Watch streams end, so the HTTP port does not wait for them. */
  readonly shutdown: AbortController;
  readonly dispatcher: Dispatcher;
  readonly broker: BrokerClient;
  readonly http: FylrHttpServer;
  /** The API tokens; undefined on an open (loopback) fylr. */
  readonly tokens: ApiTokens | undefined;
}

function assemble(p: Parts): FylrHandle {
  let state: FylrState = "running";
  const setState = (next: FylrState): void => {
    state = transitions.check(state, next);
  };
  let closing: Promise<void> | undefined;
  const close = (): Promise<void> => {
    closing ??= (async () => {
      setState("stopping");
      p.log.info("fylr stopping");
      p.shutdown.abort();
      try {
        await p.stack.run();
      } finally {
        setState("stopped");
        p.log.info("fylr stopped");
      }
    })();
    return closing;
  };
  return {
    id: p.config.id,
    port: p.http.port,
    url: p.http.url,
    address: p.http.url.replace(/^https?:\/\//, ""),
    dispatcher: p.dispatcher,
    broker: p.broker,
    http: p.http,
    get state() {
      return state;
    },
    reloadAuth: async () => (p.config.auth?.tokensFile === undefined ? undefined : p.tokens?.reload()),
    close,
    forceClose: () => {
      void p.dispatcher.stop({ graceMs: 0 }).catch(() => undefined);
      return close();
    },
    [Symbol.asyncDispose]: close,
  };
}

// Undefined while no execserver is connected, or one is polled (an address on the token
// protocol announces no services): then a submit cannot be checked.
// The env names `service` allows on every connected execserver that offers it; undefined
// when one of them did not say (an older execserver, a polled address) or none offers it.
function allowedEnv(broker: BrokerClient, service: string): ReadonlySet<string> | undefined {
  const offering = broker.instances().filter((i) => service in i.services || i.transport === "polling");
  if (offering.length === 0) return undefined;
  let allowed: Set<string> | undefined;
  for (const instance of offering) {
    const names = instance.serviceEnv?.[service];
    if (!names) return undefined;
    allowed = new Set([...(allowed ?? []), ...names]);
  }
  return allowed;
}

// Every Submit asks; the set is made again only when the broker's instance snapshot (a new
// array whenever an instance changes) is not the one it was made from.
function offeredServices(broker: BrokerClient): () => ReadonlySet<string> | undefined {
  let from: readonly unknown[] | undefined;
  let offered: ReadonlySet<string> | undefined;
  return () => {
    const instances = broker.instances();
    if (instances === from) return offered;
    from = instances;
    offered = instances.length === 0 || instances.some((i) => i.transport === "polling") ? undefined : new Set(instances.flatMap((i) => Object.keys(i.services)));
    return offered;
  };
}
