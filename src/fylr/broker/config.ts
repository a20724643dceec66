import { hostname } from "node:os";
import { z } from "zod";
import { durationMs, listenAddress, parseConfig } from "../../shared/config-parsing.js";
import { formatDuration } from "../../shared/duration.js";
import { ConfigError } from "../../shared/errors.js";
import type { BrokerTlsOptions } from "./channel-setup.js";
import type { RetryPolicy } from "../../shared/retry.js";
import type { GrowthPolicy } from "./pool-policy.js";

/** Liveness and reconnect timings of a broker connection. */
export interface ConnectionTimings {
  /** gRPC keepalive: HTTP/2 PING interval (half-open detection below the stream). */
  readonly keepaliveTimeMs: number;
  /** gRPC keepalive: how long a PING may go unanswered before the transport is dropped. */
  readonly keepaliveTimeoutMs: number;
  /** Application Ping interval while ready. */
  readonly pingIntervalMs: number;
  /** An application Ping unanswered this long restarts the stream. */
  readonly pingTimeoutMs: number;
  /** A stream that shows no HELLO this long after opening is restarted. */
  readonly helloTimeoutMs: number;
  /** Reconnect delays (jittered, so many fylrs do not reconnect in lockstep). */
  readonly backoff: RetryPolicy;
}

/** Defaults for ConnectionTimings; the broker config's defaults are these (one source). */
export const defaultConnectionTimings: ConnectionTimings = {
  keepaliveTimeMs: 300_000,
  keepaliveTimeoutMs: 20_000,
  pingIntervalMs: 10_000,
  pingTimeoutMs: 5_000,
  helloTimeoutMs: 10_000,
  backoff: { initialMs: 100, maxMs: 10_000, multiplier: 2, jitter: 0.5 },
};

const timing = defaultConnectionTimings;

/** How the fylr treats an address that does not serve BrokerService. */
export interface PollingPolicy {
  /** Each waiting job asks each polling address for a token this often. */
  readonly intervalMs: number;
  /** How often a polling address is tried for BrokerService again. */
  readonly reprobeMs: number;
  /** Capacity assumed for a polling address (items this fylr works on through it at once). */
  readonly parallel: number;
  /** Base URL of each address's token protocol. */
  readonly urls: Readonly<Record<string, URL>>;
}

/**
 * The `execserver` section of a fylr config: where the execservers are and how the broker
 * client behaves. Every duration has a unit; every key has a default but `addresses`.
 */
export const brokerConfigSchema = z.strictObject({
  /** Execserver (or load balancer) addresses, "host:port"; one pool each. */
  addresses: z.array(listenAddress).min(1, "name at least one execserver address"),
  /** Bearer token for the execservers. */
  token: z.string().min(1).optional(),
  /** This fylr's name in the execservers' status (slotbroker-client metadata). */
  clientName: z.string().min(1).max(200).optional(),
  /** TLS to the execservers: the CA to trust, the name to verify, the client certificate (mutual TLS). */
  tls: z
    .strictObject({
      caFile: z.string().min(1).optional(),
      serverName: z.string().min(1).optional(),
      /** PEM certificate chain presented to execservers that require one (their clientCaFile); with keyFile. */
      certFile: z.string().min(1).optional(),
      keyFile: z.string().min(1).optional(),
    })
    .optional(),
  /** How long a want waits for an offer before it gives up with "no slot". */
  connectTimeout: durationMs.prefault("30s"),
  /** A want parked this long without an offer is backpressure: the pool may grow. */
  retryTick: durationMs.prefault("1s"),
  /** At most one new connection per address per this interval. */
  growInterval: durationMs.prefault("2s"),
  /** Most connections per address. */
  maxConnectionsPerAddress: z.number().int().min(1).max(256).default(8),
  /** How long a covered pool stops growing before it probes for new instances again. */
  reprobeInterval: durationMs.prefault("60s"),
  /**
   * HTTP/2 keepalive PING interval. Stock gRPC servers refuse pings more often than every
   * 5 minutes by default (grpc-go answers GOAWAY "too_many_pings"); the application Ping
   * below is what detects a half-open stream, and no server polices it.
   */
  keepaliveTime: durationMs.prefault(formatDuration(timing.keepaliveTimeMs)),
  keepaliveTimeout: durationMs.prefault(formatDuration(timing.keepaliveTimeoutMs)),
  /** Application Ping interval on a ready stream (a frame on the stream, not an HTTP/2 PING). */
  pingInterval: durationMs.prefault(formatDuration(timing.pingIntervalMs)),
  /** A Ping unanswered this long restarts the stream (half-open detection). */
  pingTimeout: durationMs.prefault(formatDuration(timing.pingTimeoutMs)),
  helloTimeout: durationMs.prefault(formatDuration(timing.helloTimeoutMs)),
  reconnectInitial: durationMs.prefault(formatDuration(timing.backoff.initialMs)),
  reconnectMax: durationMs.prefault(formatDuration(timing.backoff.maxMs)),
  /** How long a want waits at start-up for the first HELLOs before judging a service unknown. */
  startupGrace: durationMs.prefault("3s"),
  /**
   * After a want won, how long its other wants stay before the UNWANT goes out. An offer
   * already in flight from another execserver arrives meanwhile and gets a DECLINE, which
   * its execserver counts as one; an UNWANT would withdraw it silently.
   */
  unwantGrace: durationMs.prefault("5ms"),
  /** How often a parked want with a position listener asks for its position (Position/Watch stay current). */
  positionInterval: durationMs.prefault("1s"),
  /**
   * After sending CANCEL for a running job, how long to wait for its DONE (whose receipt
   * says CANCEL_REQUESTED) before giving up on it: a bound for an execserver that does not answer.
   */
  cancelWait: durationMs.prefault("10s"),
  /** Host put into pipe URLs instead of the connection's local address (NAT). */
  pipeHost: z.string().min(1).optional(),
  /** An address that does not serve BrokerService is polled over the old token protocol. */
  polling: z
    .strictObject({
      enabled: z.boolean().default(true),
      /** Each waiting job asks each polling address for a token this often. */
      interval: durationMs.prefault("1s"),
      /** How often a polling address is tried for BrokerService again. */
      reprobe: durationMs.prefault("10s"),
      /** Items this fylr works on at once through one polling address (it announces no capacity). */
      parallel: z.number().int().min(1).max(10_000).default(4),
      /** Address → base URL of its token protocol; default http://ADDRESS (https:// with tls). */
      urls: z.record(z.string(), z.url({ protocol: /^https?$/ })).default({}),
    })
    .prefault({}),
});

/** The raw `execserver` section as written in YAML. */
export type BrokerConfigInput = z.input<typeof brokerConfigSchema>;

/** The compiled broker settings: durations in milliseconds, everything defaulted. */
export interface BrokerConfig {
  readonly addresses: readonly string[];
  readonly token: string | undefined;
  readonly clientName: string;
  readonly tls: BrokerTlsOptions | undefined;
  readonly connectTimeoutMs: number;
  readonly growth: GrowthPolicy;
  readonly timings: ConnectionTimings;
  readonly startupGraceMs: number;
  readonly positionIntervalMs: number;
  readonly unwantGraceMs: number;
  /** After CANCEL for a running job, how long its DONE is waited for. */
  readonly cancelWaitMs: number;
  readonly pipeHost: string | undefined;
  /** Polling fallback for addresses without BrokerService; undefined when disabled. */
  readonly polling: PollingPolicy | undefined;
}

/** Validates and compiles an `execserver` section; throws ConfigError naming the key. */
export function compileBrokerConfig(raw: unknown, source = "execserver"): BrokerConfig {
  const c = parseConfig(brokerConfigSchema, raw, source);
  const positive = { connectTimeout: c.connectTimeout, retryTick: c.retryTick, growInterval: c.growInterval, pingInterval: c.pingInterval };
  for (const [key, ms] of Object.entries(positive)) {
    if (ms <= 0) throw new ConfigError(`${source}: ${key}: must be more than 0`);
  }
  if (c.reconnectMax < c.reconnectInitial) {
    throw new ConfigError(`${source}: reconnectMax: must not be less than reconnectInitial`);
  }
  if (new Set(c.addresses).size !== c.addresses.length) throw new ConfigError(`${source}: addresses: listed twice`);
  // The files themselves are read when the broker client starts (see readTlsMaterial).
  if (c.tls && (c.tls.certFile === undefined) !== (c.tls.keyFile === undefined)) {
    const missing = c.tls.certFile === undefined ? "certFile" : "keyFile";
    throw new ConfigError(`${source}: tls.${missing}: required with tls.${missing === "certFile" ? "keyFile" : "certFile"} (a client certificate needs both)`);
  }
  const polling = compilePolling(c, source);
  return {
    addresses: c.addresses,
    token: c.token,
    clientName: c.clientName ?? `fylr@${hostname()}`,
    tls: c.tls,
    connectTimeoutMs: c.connectTimeout,
    growth: {
      retryTickMs: c.retryTick,
      growIntervalMs: c.growInterval,
      maxConnections: c.maxConnectionsPerAddress,
      reprobeMs: c.reprobeInterval,
    },
    timings: {
      keepaliveTimeMs: c.keepaliveTime,
      keepaliveTimeoutMs: c.keepaliveTimeout,
      pingIntervalMs: c.pingInterval,
      pingTimeoutMs: c.pingTimeout,
      helloTimeoutMs: c.helloTimeout,
      backoff: { ...timing.backoff, initialMs: c.reconnectInitial, maxMs: c.reconnectMax },
    },
    startupGraceMs: c.startupGrace,
    positionIntervalMs: c.positionInterval,
    unwantGraceMs: c.unwantGrace,
    cancelWaitMs: c.cancelWait,
    pipeHost: c.pipeHost,
    polling,
  };
}

function compilePolling(c: z.output<typeof brokerConfigSchema>, source: string): PollingPolicy | undefined {
  const p = c.polling;
  for (const [key, ms] of Object.entries({ interval: p.interval, reprobe: p.reprobe })) {
    if (ms <= 0) throw new ConfigError(`${source}: polling.${key}: must be more than 0`);
  }
  for (const address of Object.keys(p.urls)) {
    if (!c.addresses.includes(address)) throw new ConfigError(`${source}: polling.urls: "${address}" is not one of addresses`);
  }
  if (!p.enabled) return undefined;
  const scheme = c.tls ? "https" : "http";
  const urls = Object.fromEntries(c.addresses.map((a) => [a, new URL(p.urls[a] ?? `${scheme}://${a}/`)]));
  return { intervalMs: p.interval, reprobeMs: p.reprobe, parallel: p.parallel, urls };
}
