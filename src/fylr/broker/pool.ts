import { EventEmitter } from "node:events";
import type { Hello } from "../../../gen/slotbroker/v1/broker_pb.js";
import { silentLogger, type Logger } from "../../shared/log.js";
import { BrokerConnection, type BrokerConnectionOptions } from "./connection.js";
import { decideGrowth, isCovered, type GrowthDecision, type GrowthPolicy } from "./pool-policy.js";

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
  readonly draining: boolean;
  /** Name of the connection that reaches it. */
  readonly connection: string;
}

/** Settings of one address pool. */
export interface AddressPoolOptions {
  readonly address: string;
  /** Options for every connection of the pool (address, name and logger are set here). */
  readonly connection: Omit<BrokerConnectionOptions, "address" | "name" | "logger">;
  readonly growth: GrowthPolicy;
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
}

/**
 * The connections to one configured address, demand-driven: one to start; one more
 * (rate-limited, capped) when a want stayed parked for a whole retry tick; a connection that
 * reaches an instance already in the pool is closed and marks the pool covered, which stops
 * growth until the re-probe interval has passed.
 */
export class AddressPool extends EventEmitter<AddressPoolEvents> {
  readonly address: string;
  readonly stats: PoolStats = { opened: 0, grown: 0, duplicatesClosed: 0 };
  private readonly options: AddressPoolOptions;
  private readonly logger: Logger;
  private readonly members = new Set<BrokerConnection>();
  private readonly abort = new AbortController();
  private tickTimer: NodeJS.Timeout | undefined;
  private lastGrowthAt: number | undefined;
  private coveredAt: number | undefined;
  private serial = 0;
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

  /** True while the covered mark stops growth. */
  get covered(): boolean {
    return isCovered({ now: Date.now(), coveredAt: this.coveredAt }, this.options.growth);
  }

  /** The distinct instances the pool's ready connections reach. */
  instances(): BrokerInstance[] {
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
    for (const conn of [...this.members]) conn.close("broker pool closed");
  }

  /** One growth decision now (also called by the tick). */
  tick(now = Date.now()): GrowthDecision {
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
    draining: hello.draining,
    connection,
  };
}
