import { randomBytes } from "node:crypto";
import { hostname } from "node:os";
import { z } from "zod";
import {
  applyEnvOverrides,
  durationMs,
  isLoopbackHost,
  listenAddress,
  parseConfig,
  readYamlFile,
  splitHostPort,
} from "../shared/config-parsing.js";
import { ConfigError } from "../shared/errors.js";
import { connectionLimitsSchema, type ConnectionLimits } from "../shared/http-limits.js";

/** Built-in in-process services: they run no process (benchmarks, load tests). */
export const builtinServices = ["noop"] as const;

/** The name of a built-in service. */
export type BuiltinService = (typeof builtinServices)[number];

const name = z.string().regex(/^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$/, "expected a name of letters, digits, '.', '_' or '-' (at most 128)");
const envName = z.string().regex(/^[A-Za-z_][A-Za-z0-9_]*$/, "expected an environment variable name");

const serviceSchema = z.strictObject({
  waitgroup: name,
  command: z.array(z.string().min(1, "argv entries must not be empty")).min(1, "command must name an executable").optional(),
  builtin: z.enum(builtinServices).optional(),
  timeout: durationMs.prefault("10m"),
  env: z.array(envName).default([]),
});

/** The YAML schema of `slotbroker execserver --config FILE`. */
export const execserverConfigSchema = z.strictObject({
  instanceId: z.string().min(1).max(128).optional(),
  listen: listenAddress.default("127.0.0.1:7600"),
  adminListen: listenAddress.default("127.0.0.1:7601"),
  token: z.string().min(1).optional(),
  tls: z
    .strictObject({ certFile: z.string().min(1), keyFile: z.string().min(1), clientCaFile: z.string().min(1).optional() })
    .optional(),
  /** How jobs reach the fylrs' pipe URLs: the CA that signs an https fylr's certificate. */
  pipes: z.strictObject({ caFile: z.string().min(1).optional() }).prefault({}),
  offerTimeout: durationMs.prefault("5s"),
  /** A gRPC connection must finish its TLS handshake and send its HTTP/2 preface within this. */
  handshakeTimeout: durationMs.prefault("10s"),
  drainTimeout: durationMs.prefault("30s"),
  cancelGrace: durationMs.prefault("2s"),
  /**
   * Who starts jobs (Linux): "auto" the native job launcher when it is built, else the
   * execserver; true a launcher process (native when built, else the Node script); false
   * the execserver itself.
   */
  jobLauncher: z.union([z.boolean(), z.literal("auto")], { error: 'expected true, false or "auto"' }).default("auto"),
  maxWantsPerConnection: z.number().int().min(1).default(100_000),
  maxWantsTotal: z.number().int().min(1).default(250_000),
  /** Header/idle deadlines and the connection cap of the admin (and legacy) HTTP listeners. */
  adminHttp: connectionLimitsSchema.prefault({}),
  waitgroups: z.record(name, z.strictObject({ processes: z.number().int().min(1).max(100_000) })),
  services: z.record(name, serviceSchema),
  /** false = legacy-only: no BrokerService; `listen` serves the token protocol over plain HTTP. */
  brokerService: z.boolean().default(true),
  /** The pre-broker token protocol (GET /token/{service}, PUT /job) for old clients. */
  legacy: z
    .strictObject({
      enabled: z.boolean().default(false),
      /** "admin" (the admin port) or a "host:port" of its own. */
      listen: z.union([z.literal("admin"), listenAddress]).default("admin"),
      /** How long an unredeemed token holds its slot. */
      tokenTtl: durationMs.prefault("10s"),
    })
    .prefault({}),
});

/** How a service runs: a command (via the runner) or a built-in. */
export type ServiceConfig = {
  /** Service name, as in WANT.service. */
  readonly name: string;
  /** The waitgroup whose slots it uses. */
  readonly waitgroup: string;
  /** Upper bound for a job's runtime. */
  readonly timeoutMs: number;
  /** Environment variable names a job may set. */
  readonly env: readonly string[];
} & ({ readonly kind: "command"; readonly command: readonly string[] } | { readonly kind: "builtin"; readonly builtin: BuiltinService });

/** A fully defaulted, validated execserver configuration. */
export interface ExecserverConfig {
  readonly instanceId: string;
  /** gRPC listen address, "host:port" (port 0 picks one). */
  readonly listen: string;
  /** Admin HTTP listen address. */
  readonly adminListen: string;
  /** Bearer token every BrokerService call must carry; undefined = no auth (loopback only). */
  readonly token: string | undefined;
  readonly tls: { readonly certFile: string; readonly keyFile: string; readonly clientCaFile?: string } | undefined;
  /** CA file trusted for https pipe URLs instead of the system's CAs; undefined: the system's. */
  readonly pipeCaFile: string | undefined;
  readonly offerTimeoutMs: number;
  /** A gRPC connection must finish its TLS handshake and send its HTTP/2 preface and first frame within this. */
  readonly handshakeTimeoutMs: number;
  readonly drainTimeoutMs: number;
  /** After a Cancel frame: SIGTERM to the job's process group, SIGKILL this much later. */
  readonly cancelGraceMs: number;
  /** Who starts jobs (Linux): "auto" the native launcher if built, else the execserver; true a launcher; false the execserver. */
  readonly jobLauncher: boolean | "auto";
  readonly maxWantsPerConnection: number;
  /** Wants parked over all connections at most; more are rejected with BOOK_FULL. */
  readonly maxWantsTotal: number;
  /** Limits of the admin and legacy HTTP listeners. */
  readonly adminHttp: ConnectionLimits;
  readonly waitgroups: Readonly<Record<string, { readonly processes: number }>>;
  readonly services: Readonly<Record<string, ServiceConfig>>;
  /** False in legacy-only mode: no gRPC server; `listen` serves the token protocol. */
  readonly brokerService: boolean;
  /** The token protocol; undefined when it is off. */
  readonly legacy: LegacyConfig | undefined;
}

/** Where and how the pre-broker token protocol is served. */
export interface LegacyConfig {
  /** "admin" (routes on the admin port), "listen" (legacy-only mode) or its own "host:port". */
  readonly listen: string;
  /** How long an unredeemed token holds its slot. */
  readonly tokenTtlMs: number;
}

/** Raw config as written in YAML (before defaults). */
export type ExecserverConfigInput = z.input<typeof execserverConfigSchema>;

/** Environment variables that override config keys. */
export const execserverEnvOverrides: Record<string, string> = {
  SLOTBROKER_TOKEN: "token",
  SLOTBROKER_LISTEN: "listen",
  SLOTBROKER_ADMIN_LISTEN: "adminListen",
  SLOTBROKER_INSTANCE_ID: "instanceId",
};

/**
 * Validates raw config (after env overrides) and compiles it into an ExecserverConfig.
 * Throws ConfigError naming the bad key.
 */
export function compileExecserverConfig(raw: unknown, source = "config", env: NodeJS.ProcessEnv = {}): ExecserverConfig {
  const input = parseConfig(execserverConfigSchema, applyEnvOverrides(raw, env, execserverEnvOverrides, execserverConfigSchema), source);
  const services: Record<string, ServiceConfig> = {};
  for (const [serviceName, s] of Object.entries(input.services)) {
    const key = `${source}: services.${serviceName}`;
    if (!(s.waitgroup in input.waitgroups)) throw new ConfigError(`${key}.waitgroup: unknown waitgroup "${s.waitgroup}"`);
    const common = { name: serviceName, waitgroup: s.waitgroup, timeoutMs: s.timeout, env: s.env };
    if (s.command && s.builtin) throw new ConfigError(`${key}: set either "command" or "builtin", not both`);
    if (s.command) services[serviceName] = { ...common, kind: "command", command: s.command };
    else if (s.builtin) services[serviceName] = { ...common, kind: "builtin", builtin: s.builtin };
    else throw new ConfigError(`${key}.command: required (or "builtin: noop")`);
    if (s.timeout <= 0) throw new ConfigError(`${key}.timeout: must be more than 0`);
  }
  const { host } = splitHostPort(input.listen)!;
  if (!input.token && !isLoopbackHost(host)) {
    throw new ConfigError(`${source}: token: required when listen (${input.listen}) is not a loopback address (or set SLOTBROKER_TOKEN)`);
  }
  if (input.offerTimeout <= 0) throw new ConfigError(`${source}: offerTimeout: must be more than 0`);
  if (input.handshakeTimeout <= 0) throw new ConfigError(`${source}: handshakeTimeout: must be more than 0`);
  const legacy = compileLegacy(input, source);
  // The admin port shows every connection's details: the same rule as the gRPC port.
  const admin = splitHostPort(input.adminListen)!;
  if (!input.token && !isLoopbackHost(admin.host)) {
    throw new ConfigError(`${source}: token: required when adminListen (${input.adminListen}) is not a loopback address (or set SLOTBROKER_TOKEN)`);
  }
  return {
    instanceId: input.instanceId ?? generateInstanceId(),
    listen: input.listen,
    adminListen: input.adminListen,
    token: input.token,
    tls: input.tls,
    pipeCaFile: input.pipes.caFile,
    offerTimeoutMs: input.offerTimeout,
    handshakeTimeoutMs: input.handshakeTimeout,
    drainTimeoutMs: input.drainTimeout,
    cancelGraceMs: input.cancelGrace,
    jobLauncher: input.jobLauncher,
    maxWantsPerConnection: input.maxWantsPerConnection,
    maxWantsTotal: input.maxWantsTotal,
    adminHttp: input.adminHttp,
    waitgroups: input.waitgroups,
    services,
    brokerService: input.brokerService,
    legacy,
  };
}

// Legacy-only mode stands in for an old execserver at the address fylrs already dial, so
// the token protocol moves onto `listen` and cannot be switched off there.
function compileLegacy(input: z.output<typeof execserverConfigSchema>, source: string): LegacyConfig | undefined {
  const { legacy } = input;
  if (legacy.tokenTtl <= 0) throw new ConfigError(`${source}: legacy.tokenTtl: must be more than 0`);
  if (input.brokerService) {
    if (!legacy.enabled) return undefined;
    checkLegacyListen(legacy.listen, input, source);
    return { listen: legacy.listen, tokenTtlMs: legacy.tokenTtl };
  }
  if (legacy.listen !== "admin") {
    throw new ConfigError(`${source}: legacy.listen: with brokerService: false the token protocol is served on "listen"; remove legacy.listen`);
  }
  return { listen: "listen", tokenTtlMs: legacy.tokenTtl };
}

function checkLegacyListen(listen: string, input: z.output<typeof execserverConfigSchema>, source: string): void {
  const address = listen === "admin" ? input.adminListen : listen;
  const { host, port } = splitHostPort(address)!;
  if (listen !== "admin" && port !== 0 && (address === input.listen || address === input.adminListen)) {
    throw new ConfigError(`${source}: legacy.listen: ${address} is already taken by ${address === input.listen ? "listen" : "adminListen"}; use "admin" to share the admin port`);
  }
  if (!input.token && !isLoopbackHost(host)) {
    const key = listen === "admin" ? `legacy.listen: admin (adminListen ${address})` : `legacy.listen (${address})`;
    throw new ConfigError(`${source}: token: required when ${key} is not a loopback address (or set SLOTBROKER_TOKEN)`);
  }
}

/** Reads, validates and compiles a YAML config file, applying environment overrides. */
export function loadExecserverConfig(path: string, env: NodeJS.ProcessEnv = process.env): ExecserverConfig {
  return compileExecserverConfig(readYamlFile(path), path, env);
}

/** hostname + 8 random hex chars: unique per boot, still readable in logs. */
export function generateInstanceId(): string {
  return `${hostname()}-${randomBytes(4).toString("hex")}`;
}
