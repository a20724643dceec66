// The records the broker core keeps: connections, their jobs, waitgroups, and the shapes
// of its effects and options. Data and small invariants only; the rules live in
// broker-core.ts.
import type { ConnectResponse, PositionState, RejectCode } from "../../gen/slotbroker/v1/broker_pb.js";
import type { ServiceConfig } from "./config.js";
import type { CheckedJob } from "./limits.js";
import { SlotLedger } from "./slot-ledger.js";
import { WantBook, type ParkedWant } from "./want-book.js";

/** Where a job_id stands on its connection; "ended" once it left the connection. */
export type JobState = "parked" | "offered" | "running" | "ended";

/** How an offer ended. */
export type OfferOutcome = "accepted" | "declined" | "expired" | "withdrawn" | "dropped";

/** Where a connection's outgoing frames go (the session's stream). */
export interface FrameSink {
  /** Queues one frame to the peer, as a message or already encoded; never throws. */
  send(frame: ConnectResponse | Uint8Array): void;
  /** One of this connection's jobs finished and its DONE is queued (a half-closed stream ends after the last). */
  jobFinished?(): void;
}

/**
 * A connection's lifecycle: "half-closed" once the peer ended its side — it sends no more
 * frames but still gets the DONE of every job it started — and "closed" once it is gone.
 */
export type ConnectionLifecycle = "open" | "half-closed" | "closed";

/** One broker stream as the core sees it, with its counters for GetStatus. */
export class ClientConnection {
  /** job_id → record, for every want of this connection that is parked, offered or running. */
  readonly jobs = new Map<string, JobRecord>();
  state: ConnectionLifecycle = "open";
  wantsParked = 0;
  offers = 0;
  grants = 0;
  declines = 0;
  expired = 0;
  rejects = 0;
  running = 0;
  done = 0;

  constructor(
    /** Unique within this execserver's lifetime. */
    readonly id: string,
    /** The peer's "ip:port" as observed. */
    readonly peerAddress: string,
    /** The `slotbroker-client` metadata, or "". */
    readonly clientName: string,
    readonly connectedAt: Date,
    /** Frames for this connection go here. */
    readonly sink: FrameSink,
  ) {}
}

/** One want on one connection, from WANT until it is withdrawn or its job is done. */
export class JobRecord {
  state: JobState = "parked";
  /** The book entry while parked. */
  want: ParkedWant<JobRecord> | undefined = undefined;
  /** The current offer's token while offered. */
  offerToken = "";
  /** When the job started (caller's clock), while running. */
  startedAt = 0;
  /** When the current offer expires (clock ms), while offered. */
  expiresAt = 0;
  /** When the connection's turn that led to the current offer began (clock ms), while offered. */
  turnStartedAt = 0;
  /** True once a Cancel frame asked to stop the running job (a repeat is ignored). */
  cancelRequested = false;
  /** Opaque to the core: the running job's controller in the I/O layer. */
  handle: unknown = undefined;
  /** The job's process id once spawned (0 before, and for built-ins): logged with its outcome. */
  jobPid = 0;
  /** Job.traceparent as received ("" when none), while running. */
  traceparent = "";
  /** @internal links in the broker's offer-expiry list */
  expiryPrev: JobRecord | undefined = undefined;
  /** @internal */
  expiryNext: JobRecord | undefined = undefined;

  constructor(
    readonly jobId: string,
    readonly connection: ClientConnection,
    readonly service: ServiceConfig,
    readonly group: Waitgroup,
    readonly priority: number,
    /** When the WANT arrived (caller's clock), for grant latency. */
    readonly wantedAt: number,
  ) {}
}

/** A waitgroup: its slots and its want-book. */
export class Waitgroup {
  readonly book = new WantBook<JobRecord>();
  readonly ledger: SlotLedger;

  constructor(readonly name: string, processes: number) {
    this.ledger = new SlotLedger(name, processes);
  }
}

/** A rule a frame broke, to answer with a Reject. */
export interface RejectInfo {
  readonly code: RejectCode;
  readonly message: string;
}

/** What the core asks the I/O layer to do. */
export interface CoreEffects {
  /**
   * A slot was reserved for `record`: send OFFER with record.offerToken, and make sure
   * expireDue() gets called by record.expiresAt (one timer for all offers will do: offers
   * expire in the order they were made).
   */
  offered(record: JobRecord): void;
  /** An offer ended (accepted or not): count the outcome; tell the peer when it expired. */
  offerEnded(record: JobRecord, outcome: OfferOutcome, offerToken: string): void;
  /** An offer was accepted: run the job, then call BrokerCore.finish(record, runtimeMs). */
  start(record: JobRecord, job: CheckedJob): void;
  /**
   * Abort a running job: its connection dropped ("disconnected"), or its fylr sent Cancel
   * ("requested": the receipt then says CANCEL_REQUESTED). It still ends through finish().
   */
  cancel(record: JobRecord, why: "disconnected" | "requested"): void;
}

/** Where a want stands, for a Position frame. */
export interface PositionInfo {
  readonly state: PositionState;
  readonly waitgroup: string;
  readonly running: number;
  readonly capacity: number;
  readonly ahead: number;
  readonly etaMs: number | undefined;
}

/** Configuration the core needs. */
export interface BrokerCoreOptions {
  readonly waitgroups: Readonly<Record<string, { readonly processes: number }>>;
  readonly services: Readonly<Record<string, ServiceConfig>>;
  readonly maxWantsPerConnection: number;
  /** Wants parked over all connections at most (default: no limit beyond the per-connection one). */
  readonly maxWantsTotal?: number;
  /** How long an offer stays reserved. */
  readonly offerTimeoutMs: number;
  /** Monotonic clock in ms. */
  readonly now: () => number;
}
