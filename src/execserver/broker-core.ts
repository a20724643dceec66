import { PositionState, RejectCode, type JobSpec } from "../../gen/slotbroker/v1/broker_pb.js";
import type { ServiceConfig } from "./config.js";
import { checkFairness, checkJobId, checkJobSpec, exceedsBytes, limits } from "./limits.js";
import { TokenSource } from "./slot-ledger.js";
import { JobRecord, Waitgroup, type ClientConnection, type BrokerCoreOptions, type CoreEffects, type OfferOutcome, type PositionInfo, type RejectInfo } from "./broker-records.js";

// The broker's pure core: connections, their job records, and per waitgroup a want-book
// and a slot ledger. It has no sockets and no timers; everything it wants done in the
// world goes through CoreEffects, and the I/O layer calls back with expireDue()/finish().
// Time comes from the injected clock, so tests can drive expiry without waiting.
// Effects must not call back into the BrokerCore synchronously.

export { ClientConnection, JobRecord, Waitgroup, type JobState, type OfferOutcome, type FrameSink, type ConnectionLifecycle, type RejectInfo, type CoreEffects, type PositionInfo, type BrokerCoreOptions } from "./broker-records.js";

/** The want-books and slot ledgers of one execserver, driven frame by frame. */
export class BrokerCore {
  /** Waitgroups by name. */
  readonly waitgroups = new Map<string, Waitgroup>();
  /** Open connections by id. */
  readonly connections = new Map<string, ClientConnection>();
  private readonly services = new Map<string, { config: ServiceConfig; group: Waitgroup }>();
  /** Every running job, including those whose connection is gone. */
  readonly runningRecords = new Set<JobRecord>();
  private readonly tokens = new TokenSource();
  /** Jobs running outside the book (the legacy token protocol), counted for drain. */
  legacyRunning = 0;
  private drainingFlag = false;
  // Wants parked over all connections (the sum of every connection's wantsParked).
  private wantsParkedTotal = 0;
  // Outstanding offers, oldest first. All offers share one timeout, so this is also
  // expiry order: adding and removing are O(1) and the head is the next to expire.
  private expiryHead: JobRecord | undefined = undefined;
  private expiryTail: JobRecord | undefined = undefined;

  constructor(
    private readonly options: BrokerCoreOptions,
    private readonly effects: CoreEffects,
  ) {
    for (const [name, wg] of Object.entries(options.waitgroups)) this.waitgroups.set(name, new Waitgroup(name, wg.processes));
    for (const [name, config] of Object.entries(options.services)) {
      this.services.set(name, { config, group: this.waitgroups.get(config.waitgroup)! });
    }
  }

  /** True once drain() was called: no new wants, no new offers, no new jobs. */
  get draining(): boolean {
    return this.drainingFlag;
  }

  /** Jobs running across all waitgroups, legacy jobs included. */
  get running(): number {
    return this.runningRecords.size + this.legacyRunning;
  }

  /** The service's config and waitgroup; undefined for a service not served here. */
  service(name: string): { readonly config: ServiceConfig; readonly group: Waitgroup } | undefined {
    return this.services.get(name);
  }

  /** Registers a new stream. */
  connect(connection: ClientConnection): void {
    this.connections.set(connection.id, connection);
  }

  /**
   * Forgets a stream: its parked wants leave the books, its offers free their slots for the
   * next wants, its running jobs are cancelled (they still end through finish()).
   * O(this connection's jobs + waitgroups).
   */
  disconnect(connection: ClientConnection): void {
    if (connection.state === "closed") return;
    connection.state = "closed";
    this.connections.delete(connection.id);
    for (const record of connection.jobs.values()) {
      if (record.state === "parked") this.unpark(record);
      else if (record.state === "offered") this.endOffer(record, "dropped");
      else this.effects.cancel(record, "disconnected");
    }
    connection.jobs.clear();
    for (const wg of this.waitgroups.values()) this.pump(wg);
  }

  /**
   * The peer half-closed its side: it can answer no offer any more, so its parked wants
   * leave the books and its offers are withdrawn (their slots move on), while its running
   * jobs go on and still report DONE. Returns how many jobs still run.
   */
  halfClose(connection: ClientConnection): number {
    if (connection.state !== "open") return connection.running;
    connection.state = "half-closed";
    for (const record of [...connection.jobs.values()]) {
      if (record.state === "running") continue;
      connection.jobs.delete(record.jobId);
      if (record.state === "parked") this.unpark(record);
      else this.endOffer(record, "withdrawn");
    }
    for (const wg of this.waitgroups.values()) this.pump(wg);
    return connection.running;
  }

  /**
   * WANT: park a want under its fairness key, granting it at once when a slot is free.
   * `fairnessWeight` 0 means 1.
   */
  want(connection: ClientConnection, jobId: string, serviceName: string, priority: number, fairnessKey = "", fairnessWeight = 0): RejectInfo | undefined {
    const badId = checkJobId(jobId) ?? checkFairness(fairnessKey, fairnessWeight);
    if (badId) return this.reject(connection, RejectCode.INVALID_ARGUMENT, badId);
    if (this.drainingFlag) return this.reject(connection, RejectCode.DRAINING, "execserver is draining; want elsewhere");
    const service = this.services.get(serviceName);
    if (!service) {
      const shown = exceedsBytes(serviceName, limits.serviceBytes) ? `${serviceName.slice(0, 64)}…` : serviceName;
      return this.reject(connection, RejectCode.UNKNOWN_SERVICE, `service: "${shown}" is not served here`);
    }
    const existing = connection.jobs.get(jobId);
    if (existing) return this.reject(connection, RejectCode.DUPLICATE_JOB, `job_id: already ${existing.state} on this connection`);
    if (connection.wantsParked >= this.options.maxWantsPerConnection) {
      return this.reject(
        connection,
        RejectCode.RESOURCE_EXHAUSTED,
        `job_id: this connection already has ${connection.wantsParked} wants parked (limit ${this.options.maxWantsPerConnection})`,
      );
    }
    const maxTotal = this.options.maxWantsTotal ?? Number.POSITIVE_INFINITY;
    if (this.wantsParkedTotal >= maxTotal) {
      return this.reject(connection, RejectCode.BOOK_FULL, `job_id: the want-book is full (${this.wantsParkedTotal} wants parked, maxWantsTotal ${maxTotal}); want again later`);
    }
    const group = service.group;
    const record = new JobRecord(jobId, connection, service.config, group, priority, this.options.now());
    connection.jobs.set(jobId, record);
    connection.wantsParked++;
    this.wantsParkedTotal++;
    // An idle slot and an empty book: the want is granted at once without being parked.
    if (group.ledger.free > 0 && group.book.size === 0) this.grant(record);
    else {
      record.want = group.book.park(connection, priority, record, fairnessKey, fairnessWeight || 1);
      this.pump(group);
    }
    return undefined;
  }

  /** UNWANT: withdraw a parked or offered want; unknown or running ids are ignored. */
  unwant(connection: ClientConnection, jobId: string): void {
    const record = connection.jobs.get(jobId);
    if (!record || record.state === "running") return;
    connection.jobs.delete(jobId);
    if (record.state === "parked") this.unpark(record);
    else {
      this.endOffer(record, "withdrawn");
      // A client racing one want on several instances withdraws it here once it won
      // elsewhere, often while this offer was on its way: the slot goes to the same
      // connection's next want in the class, so the race does not cost it its turn. For one
      // offer timeout at most, or withdrawing again and again would hold the slot for ever.
      const turnStartedAt = record.turnStartedAt;
      const keepTurn = !this.drainingFlag && this.options.now() - turnStartedAt < this.options.offerTimeoutMs;
      const next = keepTurn ? record.group.book.popOwner(connection, record.priority) : undefined;
      if (next) {
        next.value.want = undefined;
        this.grant(next.value, turnStartedAt);
      }
      this.pump(record.group);
    }
  }

  /**
   * CANCEL: a parked or offered want is withdrawn exactly as by UNWANT; a running job is
   * stopped (once; repeats are ignored). Unknown ids are ignored.
   */
  cancel(connection: ClientConnection, jobId: string): void {
    const record = connection.jobs.get(jobId);
    if (!record) return;
    if (record.state !== "running") return this.unwant(connection, jobId);
    if (record.cancelRequested) return;
    record.cancelRequested = true;
    this.effects.cancel(record, "requested");
  }

  /** JOB: accept an offer and start the job (`traceparent`: Job.traceparent, checked where the job starts). */
  job(connection: ClientConnection, jobId: string, token: string, spec: JobSpec | undefined, traceparent = ""): RejectInfo | undefined {
    const record = connection.jobs.get(jobId);
    if (record?.state === "running") return this.reject(connection, RejectCode.DUPLICATE_JOB, "job_id: already running on this connection");
    if (!record || record.state !== "offered" || record.offerToken !== token) {
      return this.reject(connection, RejectCode.STALE_OFFER, "offer_token: not the current offer for this job_id (expired, withdrawn or never made)");
    }
    if (this.drainingFlag) return this.withdraw(record, RejectCode.DRAINING, "execserver is draining; the offer is withdrawn");
    const checked = checkJobSpec(spec, record.service);
    if ("error" in checked) return this.withdraw(record, RejectCode.INVALID_ARGUMENT, `${checked.error}; the offer is withdrawn`);
    this.unlinkExpiry(record);
    this.effects.offerEnded(record, "accepted", token);
    record.group.ledger.accept();
    record.state = "running";
    record.offerToken = "";
    record.startedAt = this.options.now();
    record.traceparent = traceparent;
    connection.grants++;
    connection.running++;
    this.runningRecords.add(record);
    this.effects.start(record, checked);
    return undefined;
  }

  /**
   * DECLINE: refuse an offer; the connection's turn ends and the slot goes to the next want
   * by the grant rule. Stale tokens are ignored.
   */
  decline(connection: ClientConnection, jobId: string, token: string): void {
    const record = connection.jobs.get(jobId);
    if (!record || record.state !== "offered" || record.offerToken !== token) return;
    connection.jobs.delete(jobId);
    connection.declines++;
    this.endOffer(record, "declined");
    this.endTurn(record);
    this.pump(record.group);
  }

  /** Expires every offer whose time is up; their slots go to the next wants. Returns how many. */
  expireDue(): number {
    const now = this.options.now();
    let expired = 0;
    for (let record = this.expiryHead; record && record.expiresAt <= now; record = this.expiryHead) {
      const connection = record.connection;
      if (connection.jobs.get(record.jobId) === record) connection.jobs.delete(record.jobId);
      connection.expired++;
      this.endOffer(record, "expired");
      this.endTurn(record);
      this.pump(record.group);
      expired++;
    }
    return expired;
  }

  /** When the oldest outstanding offer expires (clock ms); undefined when there is none. */
  nextExpiry(): number | undefined {
    return this.expiryHead?.expiresAt;
  }

  /** A job ended: its slot goes to the next want. */
  finish(record: JobRecord): void {
    if (record.state !== "running") throw new Error(`finish: job ${record.jobId} is ${record.state}, not running`);
    const connection = record.connection;
    record.group.ledger.finish(this.options.now() - record.startedAt);
    record.state = "ended";
    record.handle = undefined;
    this.runningRecords.delete(record);
    connection.running--;
    connection.done++;
    if (connection.jobs.get(record.jobId) === record) connection.jobs.delete(record.jobId);
    this.pump(record.group);
  }


  /** QUERY: where a job_id stands, replaying the grant rule for parked wants. */
  position(connection: ClientConnection, jobId: string): PositionInfo {
    const record = connection.jobs.get(jobId);
    if (!record) return { state: PositionState.UNSPECIFIED, waitgroup: "", running: 0, capacity: 0, ahead: 0, etaMs: undefined };
    const { ledger, book } = record.group;
    const base = { waitgroup: record.group.name, running: ledger.running, capacity: ledger.processes };
    if (record.state === "running") return { ...base, state: PositionState.RUNNING, ahead: 0, etaMs: undefined };
    if (record.state === "offered") return { ...base, state: PositionState.OFFERED, ahead: 0, etaMs: 0 };
    const ahead = book.positionOf(record.want!) ?? 0;
    const mean = ledger.meanRuntimeMs;
    // Slots turn over about every mean/capacity ms; this want needs ahead+1 of them.
    const etaMs = mean === undefined ? undefined : Math.round((mean * (ahead + 1)) / ledger.processes);
    return { ...base, state: PositionState.PARKED, ahead, etaMs };
  }

  /** Stops granting: new wants and jobs are rejected with DRAINING. Idempotent. */
  drain(): void {
    this.drainingFlag = true;
  }

  /** Offers the group's free slots to its parked wants (after a slot was freed outside the core). */
  pump(group: Waitgroup): void {
    if (this.drainingFlag) return;
    const { ledger, book } = group;
    while (ledger.free > 0) {
      const want = book.pop();
      if (!want) return;
      want.value.want = undefined;
      this.grant(want.value);
    }
  }

  // Reserves a slot for a want that is no longer (or never was) in the book.
  private grant(record: JobRecord, turnStartedAt = this.options.now()): void {
    record.state = "offered";
    record.offerToken = this.tokens.next();
    record.turnStartedAt = turnStartedAt;
    record.expiresAt = this.options.now() + this.options.offerTimeoutMs;
    this.linkExpiry(record);
    record.connection.wantsParked--;
    this.wantsParkedTotal--;
    record.connection.offers++;
    record.group.ledger.reserve();
    this.effects.offered(record);
  }

  private unpark(record: JobRecord): void {
    record.group.book.remove(record.want!);
    record.want = undefined;
    record.state = "ended";
    record.connection.wantsParked--;
    this.wantsParkedTotal--;
  }

  private endOffer(record: JobRecord, outcome: OfferOutcome): void {
    const token = record.offerToken;
    this.unlinkExpiry(record);
    record.group.ledger.withdraw();
    record.offerToken = "";
    record.state = "ended";
    this.effects.offerEnded(record, outcome, token);
  }

  // A JOB that cannot run: the offer is withdrawn and its slot moves on.
  private withdraw(record: JobRecord, code: RejectCode, message: string): RejectInfo {
    record.connection.jobs.delete(record.jobId);
    this.endOffer(record, "withdrawn");
    this.endTurn(record);
    this.pump(record.group);
    return this.reject(record.connection, code, message);
  }

  // An offer refused, lapsed or withdrawn by the server spends the connection's turn, also
  // when the offer was made at once on a free slot (pop() never moved the cursor for it):
  // its next want waits for the next round like anyone's. UNWANT alone keeps the turn.
  private endTurn(record: JobRecord): void {
    record.group.book.passTurn(record.connection, record.priority);
  }

  private linkExpiry(record: JobRecord): void {
    record.expiryPrev = this.expiryTail;
    record.expiryNext = undefined;
    if (this.expiryTail) this.expiryTail.expiryNext = record;
    else this.expiryHead = record;
    this.expiryTail = record;
  }

  private unlinkExpiry(record: JobRecord): void {
    if (record.expiryPrev) record.expiryPrev.expiryNext = record.expiryNext;
    else this.expiryHead = record.expiryNext;
    if (record.expiryNext) record.expiryNext.expiryPrev = record.expiryPrev;
    else this.expiryTail = record.expiryPrev;
    record.expiryPrev = record.expiryNext = undefined;
  }

  private reject(connection: ClientConnection, code: RejectCode, message: string): RejectInfo {
    connection.rejects++;
    return { code, message };
  }
}
