import { EventEmitter } from "node:events";
import type { Hello } from "../../../gen/slotbroker/v1/broker_pb.js";
import { Code, SlotbrokerError } from "../../shared/errors.js";
import { silentLogger, type Logger } from "../../shared/log.js";
import type { TokenEndpoint } from "../legacy/token-http.js";
import { BrokerConnection, type BrokerConnectionOptions } from "./connection.js";
import { answersHttp1 } from "./http-probe.js";
import { tlsHandshakeProblem } from "./tls-probe.js";
import { decideGrowth, isCovered, type GrowthDecision, type GrowthPolicy } from "./pool-policy.js";

/**
 * How a pool reaches its address: "broker" streams, or "polling" the old token protocol
 * because the address does not serve BrokerService (UNIMPLEMENTED, an HTTP 404, or a plain
 * HTTP/1 server). A polling pool re-probes for BrokerService and moves back when it answers.
 */
export type PoolTransport = "broker" | "polling";

/** How a pool falls back to the token protocol. */
export interface PoolPolling {
  /** The address's token protocol. */
  readonly endpoint: TokenEndpoint;
  /** Capacity announced for the address while polling. */
  readonly parallel: number;
  /** How often a polling pool tries BrokerService again. */
  readonly reprobeMs: number;
}

// A failing TLS connection is diagnosed at most this often.
const TLS_DIAGNOSIS_MS = 30_000;
// A service an address answered 404 for is not polled there again for this long.
const UNKNOWN_SERVICE_MS = 30_000;

/** One execserver instance reached through the broker, as its latest HELLO describes it. */
export interface BrokerInstance {
  /** HELLO.instance_id. */
  readonly instanceId: string;
  /** The configured address it was reached through. */
  readonly address: string;
  /** Σ HELLO.waitgroups[].processes; 0 while draining, so no work is claimed for it. */
  readonly capacity: number;
  /** Σ processes regardless of draining. */
  readonly processes: number;
  /** HELLO.clients: broker streams connected to the instance, ours included. */
  readonly clients: number;
  /** HELLO.services: service → waitgroup. */
  readonly services: Readonly<Record<string, string>>;
  /** HELLO.service_env: service → the env names a job may set; undefined from older execservers. */
  readonly serviceEnv?: Readonly<Record<string, readonly string[]>>;
  readonly draining: boolean;
  /** Name of the connection that reaches it ("polling" for a polled address). */
  readonly connection: string;
  /** How it is reached: broker streams, or polling its token protocol. */
  readonly transport: PoolTransport;
}

/** Settings of one address pool. */
export interface AddressPoolOptions {
  readonly address: string;
  /** Options for every connection of the pool (address, name and logger are set here). */
  readonly connection: Omit<BrokerConnectionOptions, "address" | "name" | "logger">;
  readonly growth: GrowthPolicy;
  /** Fall back to polling when the address does not serve BrokerService; never when unset. */
  readonly polling?: PoolPolling;
  readonly logger?: Logger;
}

/** Counters of an address pool, for status pages and tests. */
export interface PoolStats {
  /** Connections ever opened (the first one included). */
  opened: number;
  /** Connections opened because of backpressure. */
  grown: number;
  /** Connections closed because they reached an instance the pool already had. */
  duplicatesClosed: number;
  /** Switches to polling (the address did not serve BrokerService). */
  fallbacks: number;
  /** Switches back to broker streams after a re-probe. */
  recoveries: number;
}

/** The events an address pool emits. */
export interface AddressPoolEvents {
  /** A connection joined the pool; it has not started yet, so handlers can be attached. */
  connection: [conn: BrokerConnection];
  /** A connection left the pool (closed). */
  removed: [conn: BrokerConnection];
  /** The set of reachable instances or one of their HELLOs changed. */
  instances: [];
  /** A connection reached an instance the pool already had and was closed. */
  duplicate: [instanceId: string];
  /** The covered mark lapsed: the pool may grow (probe for new instances) again. */
  uncovered: [];
  /** One growth decision was made (every tick). */
  tick: [decision: GrowthDecision];
  /** The pool switched transport. */
  transport: [transport: PoolTransport];
}

/**
 * The connections to one configured address, demand-driven: one to start; one more
 * (rate-limited, capped) when a want stayed parked for a whole retry tick; a connection that
 * reaches an instance already in the pool is closed and marks the pool covered, which stops
 * growth until the re-probe interval has passed.
 */
export class AddressPool extends EventEmitter<AddressPoolEvents> {
  readonly address: string;
  readonly stats: PoolStats = { opened: 0, grown: 0, duplicatesClosed: 0, fallbacks: 0, recoveries: 0 };
  private readonly options: AddressPoolOptions;
  private readonly logger: Logger;
  private readonly members = new Set<BrokerConnection>();
  private readonly abort = new AbortController();
  private tickTimer: NodeJS.Timeout | undefined;
  private lastGrowthAt: number | undefined;
  private coveredAt: number | undefined;
  private serial = 0;
  private transportValue: PoolTransport = "broker";
  // An HTTP probe is deciding whether a failed connect means "old execserver".
  private checking = false;
  private reprobeTimer: NodeJS.Timeout | undefined;
  private tls: { diagnosing: boolean; at: number; problem: string | undefined } = { diagnosing: false, at: -Infinity, problem: undefined };
  private readonly unknownServices = new Map<string, number>();
  /** The latest growth decision, for status and tests. */
  lastDecision: GrowthDecision | undefined;

  constructor(options: AddressPoolOptions) {
    super();
    this.options = options;
    this.address = options.address;
    this.logger = (options.logger ?? silentLogger).child({ component: "broker-pool", address: options.address });
  }

  /** Opens the first connection and starts the growth tick. */
  start(): void {
    if (this.abort.signal.aborted || this.members.size > 0) return;
    this.open();
    const { retryTickMs, growIntervalMs } = this.options.growth;
    // Tick faster than the thresholds so a want is noticed soon after it crossed one.
    const every = Math.max(20, Math.floor(Math.min(retryTickMs, growIntervalMs) / 2));
    this.tickTimer = setInterval(() => this.tick(), every);
    this.tickTimer.unref();
  }

  /** Connections of the pool (not closed). */
  connections(): readonly BrokerConnection[] {
    return [...this.members];
  }

  /** Broker streams or polling. */
  get transport(): PoolTransport {
    return this.transportValue;
  }

  /** The token protocol endpoint, while polling. */
  get endpoint(): TokenEndpoint | undefined {
    return this.transportValue === "polling" ? this.options.polling?.endpoint : undefined;
  }

  /**
   * True once the pool knows how it reaches its address: polling, a ready connection, or
   * a failed one that is not being checked for an old execserver right now.
   */
  get settled(): boolean {
    if (this.transportValue === "polling") return true;
    return [...this.members].some((c) => c.state === "ready" || (c.lastError !== undefined && !this.checking));
  }

  /** True unless this polling address answered 404 for the service recently. */
  mayServe(service: string, now = Date.now()): boolean {
    const until = this.unknownServices.get(service);
    if (until === undefined) return true;
    if (until > now) return false;
    this.unknownServices.delete(service);
    return true;
  }

  /** The polling address answered 404 for the service: stop asking it for a while. */
  markUnknown(service: string, now = Date.now()): void {
    this.unknownServices.set(service, now + UNKNOWN_SERVICE_MS);
  }

  /** Why TLS to the address fails (a refused client certificate, an untrusted server), until a connection works. */
  get tlsProblem(): string | undefined {
    return this.tls.problem;
  }

  /** True while the covered mark stops growth. */
  get covered(): boolean {
    return isCovered({ now: Date.now(), coveredAt: this.coveredAt }, this.options.growth);
  }

  /** The distinct instances the pool's ready connections reach (one stand-in while polling). */
  instances(): BrokerInstance[] {
    const polling = this.options.polling;
    if (this.transportValue === "polling" && polling) {
      const p = polling.parallel;
      const id = `polling:${this.address}`;
      return [{ instanceId: id, address: this.address, capacity: p, processes: p, clients: 1, services: {}, draining: false, connection: "polling", transport: "polling" }];
    }
    const out = new Map<string, BrokerInstance>();
    for (const conn of this.members) {
      const id = conn.instanceId;
      if (id === undefined || out.has(id)) continue;
      out.set(id, describeInstance(conn.hello!, this.address, conn.name));
    }
    return [...out.values()];
  }

  /** Closes every connection and stops growing. Idempotent. */
  close(): void {
    if (this.abort.signal.aborted) return;
    this.abort.abort();
    clearInterval(this.tickTimer);
    clearTimeout(this.reprobeTimer);
    for (const conn of [...this.members]) conn.close("broker pool closed");
  }

  /** One growth decision now (also called by the tick); a polling pool does not grow. */
  tick(now = Date.now()): GrowthDecision {
    if (this.transportValue === "polling") return (this.lastDecision = { grow: false, reason: "polling" });
    let oldest: number | undefined;
    let pending = 0;
    for (const conn of this.members) {
      if (conn.state !== "ready") {
        if (conn.hello === undefined) pending++;
        continue;
      }
      const at = conn.oldestParkedAt();
      if (at !== undefined && (oldest === undefined || at < oldest)) oldest = at;
    }
    const decision = decideGrowth(
      { now, oldestParkedAt: oldest, connections: this.members.size, pending, lastGrowthAt: this.lastGrowthAt, coveredAt: this.coveredAt },
      this.options.growth,
    );
    if (decision.grow && !this.abort.signal.aborted) {
      this.lastGrowthAt = now;
      this.stats.grown++;
      const conn = this.open();
      this.logger.info({ conn: conn.name, connections: this.members.size }, "backpressure: opened one more connection");
    }
    if (this.coveredAt !== undefined && !this.covered) {
      this.coveredAt = undefined;
      this.emit("uncovered");
    }
    this.lastDecision = decision;
    this.emit("tick", decision);
    return decision;
  }

  private open(): BrokerConnection {
    const conn = new BrokerConnection({
      ...this.options.connection,
      address: this.address,
      name: `${this.address}#${++this.serial}`,
      logger: this.options.logger,
    });
    this.members.add(conn);
    this.stats.opened++;
    conn.on("hello", (hello, first) => this.onHello(conn, hello, first));
    conn.on("state", (state, previous) => {
      // Before the instances event, so listeners see the pool's new transport.
      if (state === "ready" && this.transportValue === "polling") this.backToBroker(conn);
      if (state === "ready") this.tls.problem = undefined;
      if (state === "backoff" && previous === "connecting") this.connectFailed(conn);
      if (state === "closed") {
        this.members.delete(conn);
        this.emit("removed", conn);
      }
      if (state === "ready" || previous === "ready" || state === "closed") this.emit("instances");
    });
    this.emit("connection", conn);
    conn.start();
    return conn;
  }

  // A stream failed before its HELLO. In broker mode that may be an old execserver:
  // UNIMPLEMENTED (a gRPC server without BrokerService, or an HTTP 404) says so at once;
  // UNAVAILABLE is checked with one plain HTTP request. While polling, the re-probe failed.
  private connectFailed(conn: BrokerConnection): void {
    if (this.abort.signal.aborted) return;
    this.diagnoseTls(conn);
    const polling = this.options.polling;
    if (!polling) return;
    if (this.transportValue === "polling") {
      conn.close("re-probe: the address still does not serve BrokerService");
      this.scheduleReprobe();
      return;
    }
    const code = conn.lastError instanceof SlotbrokerError ? conn.lastError.code : undefined;
    if (code === Code.Unimplemented) return this.fallBack(conn.lastError!.message);
    if (code !== Code.Unavailable || this.checking) return;
    this.checking = true;
    void answersHttp1(polling.endpoint.url, 2000, polling.endpoint).then((http1) => {
      this.checking = false;
      const reached = [...this.members].some((c) => c.state === "ready");
      if (http1 && !reached && this.transportValue === "broker" && !this.abort.signal.aborted) {
        this.fallBack(`a plain HTTP server answers at ${polling.endpoint.url.origin}`);
      } else this.emit("instances");
    });
  }

  // A TLS connection that fails to connect: one handshake of our own (at most every 30 s)
  // says why, in the log at warn level and in the fylr's readiness.
  private diagnoseTls(conn: BrokerConnection): void {
    const options = this.options.connection.tls;
    const code = conn.lastError instanceof SlotbrokerError ? conn.lastError.code : undefined;
    if (!options || code !== Code.Unavailable || this.tls.diagnosing || Date.now() - this.tls.at < TLS_DIAGNOSIS_MS) return;
    this.tls.diagnosing = true;
    void tlsHandshakeProblem(this.address, options).then((problem) => {
      this.tls = { diagnosing: false, at: Date.now(), problem };
      if (problem && !this.abort.signal.aborted) this.logger.warn({ err: conn.lastError?.message }, problem);
    });
  }

  private fallBack(reason: string): void {
    this.transportValue = "polling";
    this.stats.fallbacks++;
    this.logger.warn({ reason, url: this.options.polling!.endpoint.url.origin }, "address does not serve BrokerService; polling its token protocol");
    for (const conn of [...this.members]) conn.close("the address does not serve BrokerService; polling instead");
    this.scheduleReprobe();
    this.emit("transport", "polling");
    this.emit("instances");
  }

  private scheduleReprobe(): void {
    clearTimeout(this.reprobeTimer);
    this.reprobeTimer = setTimeout(() => {
      this.reprobeTimer = undefined;
      if (this.transportValue === "polling" && !this.abort.signal.aborted && this.members.size === 0) this.open();
    }, this.options.polling!.reprobeMs);
    this.reprobeTimer.unref();
  }

  private backToBroker(conn: BrokerConnection): void {
    this.transportValue = "broker";
    this.stats.recoveries++;
    this.logger.info({ conn: conn.name }, "the address serves BrokerService again; polling stops");
    this.emit("transport", "broker");
  }

  private onHello(conn: BrokerConnection, hello: Hello, first: boolean): void {
    if (!first) {
      this.emit("instances");
      return;
    }
    const twin = [...this.members].find((other) => other !== conn && other.instanceId === hello.instanceId);
    if (!twin) return;
    // The balancer sent this connection to a pod the pool already reaches: keep the older
    // one, so the execserver counts this fylr once, and stop growing for a while.
    this.stats.duplicatesClosed++;
    this.coveredAt = Date.now();
    this.logger.info({ conn: conn.name, instanceId: hello.instanceId, twin: twin.name }, "duplicate instance; closing and marking the pool covered");
    conn.close(`duplicate connection to instance ${hello.instanceId}`);
    this.emit("duplicate", hello.instanceId);
  }
}

/** A BrokerInstance from a HELLO. */
export function describeInstance(hello: Hello, address: string, connection: string): BrokerInstance {
  let processes = 0;
  for (const wg of hello.waitgroups) processes += wg.processes;
  return {
    instanceId: hello.instanceId,
    address,
    capacity: hello.draining ? 0 : processes,
    processes,
    clients: hello.clients,
    services: hello.services,
    ...(Object.keys(hello.serviceEnv).length > 0 ? { serviceEnv: Object.fromEntries(Object.entries(hello.serviceEnv).map(([k, v]) => [k, v.names])) } : {}),
    draining: hello.draining,
    connection,
    transport: "broker",
  };
}
