import { randomBytes } from "node:crypto";
import { RejectCode, type Offer, type Position, type Reject } from "../../../gen/slotbroker/v1/broker_pb.js";
import { onAbort } from "../../shared/abort.js";
import { Code, SlotbrokerError } from "../../shared/errors.js";
import { fairnessLimits } from "../../shared/job-limits.js";
import { silentLogger, type Logger } from "../../shared/log.js";
import { Events } from "../../shared/typed-events.js";
import { Acquisition, type AcquiredSlot } from "./acquisition.js";
import { currentTlsMaterial } from "./channel-setup.js";
import type { BrokerConfig } from "./config.js";
import type { BrokerConnection } from "./connection.js";
import type { ParkedWantInfo } from "./connection-state.js";
import { JobRejectedError, NoSlotError } from "./errors.js";
import type { BrokerClientEvents, BrokerClientStats } from "./events.js";
import { PolledSlot } from "./polled-slot.js";
import { AddressPool, type BrokerInstance, type PoolPolling } from "./pool.js";
import { RunningJobs } from "./running-jobs.js";
import { listedAnywhere, StartupGrace, unknownServiceError } from "./service-listing.js";
import { emptyReceipt, Slot } from "./slot.js";
import { TokenPolls } from "./token-polls.js";
import { RaceBook } from "./want-race.js";

export type { AcquiredSlot } from "./acquisition.js";

/** One request for a slot. */
export interface AcquireOptions {
  readonly service: string;
  /** Larger is more urgent (default 0). */
  readonly priority?: number;
  /**
   * Fairness key, e.g. the tenant (default "": the default key). Within a priority, each
   * execserver serves this fylr's wants key by key, weighted round-robin, oldest first
   * within a key. At most 128 bytes.
   */
  readonly fairnessKey?: string;
  /** Grants per turn of the key: an integer from 1 to 1000 (default 1). */
  readonly fairnessWeight?: number;
  /** Aborting UNWANTs everywhere and rejects with the signal's reason. */
  readonly signal?: AbortSignal;
  /** Give up with NoSlotError after this long (default: the config's connectTimeout). */
  readonly connectTimeoutMs?: number;
  /** Called with each POSITION while parked (queried every positionInterval). */
  readonly onPosition?: (position: Position, instanceId: string) => void;
}

type BrokerState = "idle" | "running" | "closed";

/**
 * The fylr's side of the broker: a demand-driven pool per configured address, WANTs routed
 * to connections whose HELLO lists the service, and slot acquisition as a race — parked on
 * one connection per distinct instance, the first OFFER wins, later ones are DECLINEd, the
 * rest UNWANTed.
 */
export class BrokerClient {
  readonly config: BrokerConfig;
  /** Lifecycle events: connections up/down, wants parked, offers taken or declined, jobs done. */
  readonly events: Events<BrokerClientEvents>;
  readonly stats: BrokerClientStats = { accepted: 0, declined: 0, substituted: 0, noSlot: 0, polled: 0, tokenRequests: 0 };
  private state: BrokerState = "idle";
  private readonly logger: Logger;
  private readonly addressPools: AddressPool[];
  private readonly book = new RaceBook<BrokerConnection, Acquisition>();
  private readonly jobs = new RunningJobs();
  private readonly polls: TokenPolls | undefined;
  // The connection each distinct instance is parked on; other connections to the same
  // instance (through another configured address) stay idle.
  private readonly primaries = new Map<string, BrokerConnection>();
  private readonly grace: StartupGrace;
  private readonly unwants: UnwantQueue;
  private snapshot: readonly BrokerInstance[] | undefined;
  private readonly jobIds = new JobIds();

  constructor(config: BrokerConfig, options: { logger?: Logger } = {}) {
    this.config = config;
    this.logger = (options.logger ?? silentLogger).child({ component: "broker" });
    this.events = new Events((err, event) => this.logger.error({ err, event }, "a broker client event listener threw"));
    this.unwants = new UnwantQueue(config.unwantGraceMs);
    this.grace = new StartupGrace(config.startupGraceMs, () => this.addressPools.every((pool) => pool.settled));
    const connection = { token: config.token, clientName: config.clientName, tls: config.tls, timings: config.timings };
    // Read once here, so an unreadable file or a certificate without its key is a ConfigError at start.
    const material = config.tls ? currentTlsMaterial(config.tls) : undefined;
    const polling = (address: string): PoolPolling | undefined => {
      const p = config.polling;
      if (!p) return undefined;
      return { endpoint: { url: p.urls[address]!, token: config.token, ...material }, parallel: p.parallel, reprobeMs: p.reprobeMs };
    };
    this.addressPools = config.addresses.map(
      (address) => new AddressPool({ address, connection, growth: config.growth, polling: polling(address), logger: options.logger }),
    );
    if (config.polling) {
      this.polls = new TokenPolls({
        pools: this.addressPools,
        intervalMs: config.polling.intervalMs,
        stats: this.stats,
        won: (acq, pool, grant) => this.wonByToken(acq, pool, grant),
        unknown: (acq) => this.unknownEverywhere(acq),
        logger: this.logger,
      });
    }
    for (const pool of this.addressPools) {
      pool.on("connection", (conn) => this.wire(conn));
      pool.on("instances", () => this.instancesChanged());
      pool.on("transport", (transport) => {
        this.events.emit("pool:transport", pool.address, transport);
        this.instancesChanged();
        if (transport === "polling") for (const acq of this.book.all()) this.polls?.start(acq);
      });
    }
  }

  /** Opens the first connection of every pool; `signal` (e.g. shutdown) closes the broker. */
  start(signal?: AbortSignal): void {
    if (this.state !== "idle") return;
    if (signal?.aborted) {
      void this.close();
      return;
    }
    signal?.addEventListener("abort", () => void this.close(), { once: true });
    this.state = "running";
    this.grace.begin();
    for (const pool of this.addressPools) pool.start();
  }

  /** The address pools, in configuration order. */
  pools(): readonly AddressPool[] {
    return this.addressPools;
  }

  /** The distinct instances reachable now (deduplicated across addresses by instance_id). */
  instances(): readonly BrokerInstance[] {
    if (this.snapshot) return this.snapshot;
    const seen = new Map<string, BrokerInstance>();
    for (const pool of this.addressPools) {
      for (const instance of pool.instances()) if (!seen.has(instance.instanceId)) seen.set(instance.instanceId, instance);
    }
    return (this.snapshot = [...seen.values()]);
  }

  /** Calls `listener` after the instance snapshot changed; returns the unsubscribe function. */
  subscribe(listener: () => void): () => void {
    return this.events.on("instances", listener);
  }

  /** Wants parked right now. */
  get parked(): number {
    return this.book.size;
  }

  /** Jobs sent and not yet done. */
  get running(): number {
    return this.jobs.size;
  }

  /**
   * Waits for a slot of `service`: parks one want on every instance that offers it and
   * resolves with the first offer (a Slot; send the job with `slot.start`). Rejects with
   * UnknownServiceError at once when connected execservers exist but none offers the
   * service, NoSlotError when no offer came within connectTimeout, or the signal's reason.
   */
  acquire(options: AcquireOptions): Promise<AcquiredSlot> {
    if (this.state !== "running") return Promise.reject(new SlotbrokerError(Code.FailedPrecondition, `broker is ${this.state}`));
    // The common case skips the start-up wait without an extra turn of the event loop.
    if (this.grace.isSettled()) return this.enqueue(options);
    return this.grace.wait(options.signal).then(() => this.enqueue(options));
  }

  private enqueue(options: AcquireOptions): Promise<AcquiredSlot> {
    if (options.signal?.aborted) return Promise.reject(options.signal.reason as Error);
    if (this.state !== "running") return Promise.reject(new SlotbrokerError(Code.Unavailable, "the broker client was closed"));
    const service = options.service;
    // Fail fast only when no connected instance lists the service at all; one that lists
    // it but is draining (a rolling restart) means a replacement is likely: wait for it.
    if (!listedAnywhere(this.addressPools, this.primaries.values(), service)) {
      return Promise.reject(unknownServiceError(service, this.primaries.values()));
    }
    const fairnessKey = options.fairnessKey ?? "";
    const fairnessWeight = options.fairnessWeight ?? 1;
    const badFairness = checkFairness(fairnessKey, fairnessWeight);
    if (badFairness) return Promise.reject(new SlotbrokerError(Code.InvalidArgument, badFairness));
    const timeoutMs = options.connectTimeoutMs ?? this.config.connectTimeoutMs;
    return new Promise<AcquiredSlot>((resolve, reject) => {
      const jobId = this.jobIds.next();
      const acq = new Acquisition(jobId, service, options.priority ?? 0, fairnessKey, fairnessWeight, resolve, reject, options.onPosition);
      this.book.add(acq);
      for (const conn of this.primaries.values()) if (conn.serves(service)) this.park(acq, conn);
      this.polls?.start(acq);
      acq.timer = setTimeout(() => {
        const instances = acq.parkedOn.size;
        if (this.giveUp(acq)) {
          this.stats.noSlot++;
          this.events.emit("want:no-slot", jobId, service);
          reject(new NoSlotError(service, timeoutMs, instances));
        }
      }, timeoutMs);
      if (options.onPosition) {
        acq.positionTimer = setInterval(() => {
          for (const conn of acq.parkedOn) conn.query(jobId);
        }, this.config.positionIntervalMs);
      }
      const signal = options.signal;
      if (signal) {
        acq.detach = onAbort(signal, () => {
          if (this.giveUp(acq)) reject(signal.reason as Error);
        });
      }
    });
  }

  /** Fails parked wants and running jobs, closes every connection. Idempotent. */
  close(): Promise<void> {
    if (this.state === "closed") return Promise.resolve();
    this.state = "closed";
    const err = new SlotbrokerError(Code.Unavailable, "the broker client was closed");
    for (const acq of [...this.book.all()]) if (this.giveUp(acq)) acq.reject(err);
    this.unwants.flushAll();
    for (const pool of this.addressPools) pool.close();
    this.grace.end();
    return Promise.resolve();
  }

  // A polling round won a token while the acquisition was still parked.
  private wonByToken(acq: Acquisition, pool: AddressPool, grant: PolledSlot["grant"]): void {
    this.stats.polled++;
    this.unwants.add(acq.end(), acq.jobId);
    acq.clearTimers();
    this.book.delete(acq);
    const slot = new PolledSlot(acq.jobId, acq.service, pool.address, pool.endpoint!, grant);
    this.events.emit("token:won", slot);
    acq.resolve(slot);
  }

  // Every polled address answered 404 for the service and no broker instance lists it.
  private unknownEverywhere(acq: Acquisition): void {
    if (listedAnywhere(this.addressPools, this.primaries.values(), acq.service) || !this.giveUp(acq)) return;
    const polled = this.addressPools.filter((p) => p.transport === "polling").length;
    acq.reject(unknownServiceError(acq.service, this.primaries.values(), polled));
  }

  private park(acq: Acquisition, conn: BrokerConnection): void {
    if (!acq.park(conn)) return;
    conn.want(acq.jobId, acq.service, acq.priority, acq.fairnessKey, acq.fairnessWeight);
    this.events.emit("want:parked", acq.jobId, acq.service, conn);
  }

  // Ends a parked acquisition: UNWANT everywhere. False when it was already over.
  private giveUp(acq: Acquisition): boolean {
    if (acq.state !== "parked") return false;
    for (const conn of acq.end()) conn.unwant(acq.jobId);
    acq.clearTimers();
    this.book.delete(acq);
    return true;
  }

  private wire(conn: BrokerConnection): void {
    conn.on("offer", (offer, parked) => this.onOffer(conn, offer, parked));
    conn.on("done", (done) => {
      const receipt = this.jobs.done(conn, done.jobId, done.receipt, emptyReceipt);
      if (receipt) this.events.emit("job:done", done.jobId, receipt);
    });
    conn.on("lost", (jobIds, err) => {
      this.jobs.lost(conn, jobIds, err);
      this.events.emit("job:lost", jobIds, err);
    });
    conn.on("reject", (reject) => this.onReject(conn, reject));
    conn.on("unparked", (jobIds) => {
      for (const jobId of jobIds) this.book.get(jobId)?.unpark(conn);
    });
    conn.on("position", (position) => {
      const acq = this.book.get(position.jobId);
      acq?.onPosition?.(position, conn.hello?.instanceId ?? "");
    });
    conn.on("hello", (_hello, first) => {
      // A changed HELLO may list new services: park the waiting wants for them.
      if (!first && this.primaries.get(conn.instanceId ?? "") === conn) this.placeAll(conn);
    });
    conn.on("state", (state, previous) => {
      if (state === "ready") {
        this.promote(conn);
        this.events.emit("connection:up", conn, conn.instanceId!);
      } else if (previous === "ready") {
        this.demote(conn);
        this.events.emit("connection:down", conn, conn.lastError);
      }
      if (state !== "connecting") this.grace.wake();
    });
  }

  private onOffer(conn: BrokerConnection, offer: Offer, parked: ParkedWantInfo | undefined): void {
    // A surplus offer still good here may go to another want parked here (RaceBook.takerOf).
    const taker = this.book.takerOf(offer.jobId, conn, parked);
    const verdict = taker ? taker.race.offer(conn) : { accept: false as const };
    if (!taker || !verdict.accept) {
      // A surplus offer: the want already won elsewhere or was withdrawn. Free the slot now.
      this.stats.declined++;
      conn.decline(offer);
      this.events.emit("offer:declined", offer.jobId, conn);
      return;
    }
    const acq = taker.race;
    this.stats.accepted++;
    if (taker.substitute) {
      this.stats.substituted++;
      // Its own want here goes at once: this connection must not be offered it as well.
      conn.unwant(acq.jobId);
    }
    this.unwants.add(verdict.unwant, acq.jobId);
    acq.clearTimers();
    this.book.delete(acq);
    const slot = new Slot(acq.service, conn, offer, this.jobs, Date.now(), this.config.cancelWaitMs);
    this.events.emit("offer:accepted", slot);
    acq.resolve(slot);
  }

  private onReject(conn: BrokerConnection, reject: Reject): void {
    if (this.jobs.rejected(conn, reject)) return;
    const acq = this.book.get(reject.jobId);
    if (!acq) {
      this.logger.debug({ conn: conn.name, code: reject.code, message: reject.message }, "reject for no known want");
      return;
    }
    acq.unpark(conn);
    if (reject.code === RejectCode.INVALID_ARGUMENT && this.giveUp(acq)) {
      // Every execserver would refuse the same want: fail now instead of timing out.
      acq.reject(new JobRejectedError(acq.jobId, RejectCode[reject.code], reject.message, Code.InvalidArgument));
      return;
    }
    this.logger.warn({ conn: conn.name, jobId: acq.jobId, code: RejectCode[reject.code], message: reject.message }, "want rejected");
  }

  // A connection became ready: it parks wants for its instance unless another connection
  // already does (the same instance reached through a second configured address).
  private promote(conn: BrokerConnection): void {
    const instanceId = conn.instanceId!;
    const primary = this.primaries.get(instanceId);
    if (primary && primary !== conn && primary.state === "ready") {
      for (const acq of this.book.all()) {
        if (!conn.has(acq.jobId)) continue;
        acq.unpark(conn);
        conn.unwant(acq.jobId);
      }
      return;
    }
    this.primaries.set(instanceId, conn);
    this.placeAll(conn);
  }

  private demote(conn: BrokerConnection): void {
    for (const [instanceId, primary] of this.primaries) {
      if (primary !== conn) continue;
      this.primaries.delete(instanceId);
      // Another address may reach the same instance: let it take over the wants.
      const heir = this.allConnections().find((c) => c !== conn && c.instanceId === instanceId);
      if (heir) this.promote(heir);
    }
  }

  private placeAll(conn: BrokerConnection): void {
    const hello = conn.hello;
    if (!hello) return;
    for (const service of Object.keys(hello.services)) {
      if (!conn.serves(service)) continue;
      for (const acq of this.book.forService(service)) this.park(acq, conn);
    }
  }

  private allConnections(): BrokerConnection[] {
    return this.addressPools.flatMap((pool) => [...pool.connections()]);
  }

  private instancesChanged(): void {
    this.snapshot = undefined;
    this.events.emit("instances");
  }
}

/**
 * The job ids of one broker client: a random per-client prefix plus a counter. Unique among
 * this client's jobs without a crypto call per acquire (randomFillSync showed up in the
 * cycle profile).
 */
class JobIds {
  private readonly prefix = randomBytes(9).toString("base64url");
  private serial = 0;

  /** A job id not handed out before by this generator. */
  next(): string {
    return `${this.prefix}.${(++this.serial).toString(36)}`;
  }
}

/**
 * The losers' wants of won races, withdrawn after a short grace (see unwantGrace in the
 * config): an offer already in flight from another execserver arrives meanwhile and gets a
 * DECLINE, which its execserver counts, instead of vanishing in a silent UNWANT. One queue
 * and one timer for all of them, flushed in order.
 */
class UnwantQueue {
  private readonly entries: { conn: BrokerConnection; jobId: string; at: number }[] = [];
  private timer: NodeJS.Timeout | undefined;

  constructor(private readonly graceMs: number) {}

  /** UNWANTs `jobId` on `conns` after the grace (at once when it is 0). */
  add(conns: readonly BrokerConnection[], jobId: string): void {
    if (conns.length === 0) return;
    if (this.graceMs <= 0) {
      for (const conn of conns) conn.unwant(jobId);
      return;
    }
    const at = Date.now() + this.graceMs;
    for (const conn of conns) this.entries.push({ conn, jobId, at });
    this.timer ??= setTimeout(() => this.flushDue(), this.graceMs);
  }

  /** Sends every queued UNWANT now and stops the timer (closing). */
  flushAll(): void {
    clearTimeout(this.timer);
    this.timer = undefined;
    for (const { conn, jobId } of this.entries.splice(0)) conn.unwant(jobId);
  }

  private flushDue(): void {
    this.timer = undefined;
    const now = Date.now();
    let due = 0;
    while (due < this.entries.length && this.entries[due]!.at <= now) {
      const { conn, jobId } = this.entries[due++]!;
      // A surplus offer that arrived meanwhile already took the want off this connection.
      conn.unwant(jobId);
    }
    this.entries.splice(0, due);
    const next = this.entries[0];
    if (next) this.timer = setTimeout(() => this.flushDue(), Math.max(1, next.at - now));
  }
}

// Why a fairness key or weight would be rejected by every execserver, or undefined.
function checkFairness(key: string, weight: number): string | undefined {
  if (Buffer.byteLength(key) > fairnessLimits.keyBytes) return `fairnessKey: longer than ${fairnessLimits.keyBytes} bytes`;
  if (!Number.isInteger(weight) || weight < 1 || weight > fairnessLimits.weight) return `fairnessWeight: must be an integer from 1 to ${fairnessLimits.weight}, got ${weight}`;
  return undefined;
}
