/**
 * The config of `slotbroker fylr --config FILE`: YAML plus environment, validated once into
 * a fully defaulted object. A bad key is named in the error and the command exits non-zero.
 *
 *   name: fylr-a                 # the fylr id is NAME-<random>, new each start
 *   listen: 127.0.0.1:7700       # HTTP: QueueService, pipes, /healthz, /metrics, /status.json
 *   databaseUrl: postgres://…    # or DATABASE_URL (used only when the file has none)
 *   databasePoolSize: 10
 *   execserver: { addresses: [127.0.0.1:7600], token, tls: { caFile, certFile, keyFile }, connectTimeout: 30s, … }
 *   dispatcher: { headroom: 2, pollInterval: 1s, staleAfter: 15s, … }
 *   store: { maxItemBytes: 64GiB, retention: 7d, inlineBytes: 64KiB, … }
 *   queue: { retention: 7d, sweepInterval: 1m }   # finished item rows
 *   api: { watchPoll: 500ms }
 *   http: { headersTimeout: 20s, idleTimeout: 60s, maxConnections: 4096, maxRequestBytes: 16MiB }
 *   auth: { tokens: [{ name, token, scopes }], tokensFile, clients: [{ subject, scopes }] }
 *   tls: { certFile, keyFile, clientCaFile }   # TLS on `listen`
 */
import { randomBytes } from "node:crypto";
import { hostname } from "node:os";
import { z } from "zod";
// The config modules themselves, not the dispatcher's and the fylr's indexes: a config
// error is reported before the engines (pg, grpc-js, Connect) are loaded.
import { storeConfigSchema, type StoreConfig } from "../dispatcher/blobs/store-config.js";
import { dispatcherConfigSchema, type DispatcherConfig } from "../dispatcher/config.js";
import { queueConfigSchema, type QueueConfig } from "../dispatcher/queue/queue-config.js";
import { apiAuthSchema, compileApiAuth, fylrTlsSchema, type ApiAuthConfig, type FylrTlsConfig } from "../fylr/auth/config.js";
import { brokerConfigSchema, compileBrokerConfig, type BrokerConfig } from "../fylr/broker/config.js";
import { applyEnvOverrides, durationMs, listenAddress, parseConfig, readYamlFile } from "../shared/config-parsing.js";
import { ConfigError } from "../shared/errors.js";
import { httpLimitsSchema, type HttpLimits } from "../shared/http-limits.js";

/** The YAML schema of a fylr config. */
export const fylrConfigSchema = z.strictObject({
  /** A readable name; the fylr's id is `<name>-<8 hex>` (default name: the host name). */
  name: z.string().regex(/^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$/, "expected letters, digits, '.', '_' or '-' (at most 100)").optional(),
  /** The HTTP port: QueueService, pipes, /healthz, /metrics, /status.json. */
  listen: listenAddress.default("127.0.0.1:7700"),
  /** PostgreSQL URL; DATABASE_URL fills it in when unset. Required. */
  databaseUrl: z.string().min(1).optional(),
  /** Connections of this fylr's database pool. */
  databasePoolSize: z.number().int().min(2).max(1000).default(10),
  /** The broker client: execserver addresses, token, TLS, timeouts, pool growth. */
  execserver: brokerConfigSchema,
  /** The claim loop: poll, heartbeat, stale threshold, headroom, retries, limits. */
  dispatcher: dispatcherConfigSchema.prefault({}),
  /** Inputs and outputs of any size: limits, retention, the inline size. */
  store: storeConfigSchema.prefault({}),
  /** The queue table: how long finished item rows are kept. */
  queue: queueConfigSchema.prefault({}),
  api: z.strictObject({ watchPoll: durationMs.prefault("500ms") }).prefault({}),
  /** The HTTP port's limits against slow or greedy clients. */
  http: httpLimitsSchema.prefault({}),
  /** Who may use QueueService, uploads, downloads and the status page; required off loopback. */
  auth: apiAuthSchema.prefault({}),
  /** TLS on `listen` (pipe URLs become https://), with client certificates by `clientCaFile`. */
  tls: fylrTlsSchema.optional(),
});

/** The raw config as written in YAML. */
export type FylrConfigInput = z.input<typeof fylrConfigSchema>;

/** A validated, fully defaulted fylr config. */
export interface FylrConfig {
  /** This fylr's id in the `fylrs` table and the execservers' status. */
  readonly id: string;
  readonly listen: string;
  readonly databaseUrl: string;
  readonly databasePoolSize: number;
  readonly broker: BrokerConfig;
  readonly dispatcher: DispatcherConfig;
  readonly store: StoreConfig;
  readonly queue: QueueConfig;
  /** Watch's database poll for items other fylrs run. */
  readonly watchPollMs: number;
  /** Header/idle deadlines, connection and request caps of the HTTP port. */
  readonly http: HttpLimits;
  /** The API's credentials; undefined: open (only on a loopback `listen`). */
  readonly auth: ApiAuthConfig | undefined;
  readonly tls: FylrTlsConfig | undefined;
}

/** Environment variables that override config keys (DATABASE_URL only fills a gap). */
export const fylrEnvOverrides: Record<string, string> = {
  SLOTBROKER_TOKEN: "execserver.token",
  SLOTBROKER_LISTEN: "listen",
  SLOTBROKER_FYLR_NAME: "name",
  SLOTBROKER_API_TOKENS: "auth.tokens",
  SLOTBROKER_API_TOKENS_FILE: "auth.tokensFile",
};

/** Validates raw config (after env overrides); throws ConfigError naming the bad key. */
export function compileFylrConfig(raw: unknown, source = "config", env: NodeJS.ProcessEnv = {}): FylrConfig {
  const withEnv = applyEnvOverrides(raw, env, fylrEnvOverrides, fylrConfigSchema);
  if (withEnv.databaseUrl === undefined && env.DATABASE_URL) withEnv.databaseUrl = env.DATABASE_URL;
  const c = parseConfig(fylrConfigSchema, withEnv, source);
  if (!c.databaseUrl) throw new ConfigError(`${source}: databaseUrl: required (or set DATABASE_URL)`);
  if (!/^postgres(ql)?:\/\//.test(c.databaseUrl)) throw new ConfigError(`${source}: databaseUrl: expected a postgres:// URL`);
  if (c.api.watchPoll <= 0) throw new ConfigError(`${source}: api.watchPoll: must be more than 0`);
  const auth = compileApiAuth(c.auth, c.tls, c.listen, source);
  const id = `${c.name ?? hostname().replace(/[^A-Za-z0-9._-]/g, "-")}-${randomBytes(4).toString("hex")}`;
  const brokerInput = withEnv.execserver as Record<string, unknown>;
  const broker = compileBrokerConfig({ clientName: id, ...brokerInput }, `${source}: execserver`);
  return {
    id,
    listen: c.listen,
    databaseUrl: c.databaseUrl,
    databasePoolSize: c.databasePoolSize,
    broker,
    dispatcher: c.dispatcher,
    store: c.store,
    queue: c.queue,
    watchPollMs: c.api.watchPoll,
    http: c.http,
    auth,
    tls: c.tls,
  };
}

/** Reads, validates and compiles a YAML config file, applying environment overrides. */
export function loadFylrConfig(path: string, env: NodeJS.ProcessEnv = process.env): FylrConfig {
  return compileFylrConfig(readYamlFile(path), path, env);
}
