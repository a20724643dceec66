import type { Receipt } from "../../../gen/slotbroker/v1/broker_pb.js";
import type { BrokerConnection } from "./connection.js";
import type { PolledSlot } from "./polled-slot.js";
import type { PoolTransport } from "./pool.js";
import type { Slot } from "./slot.js";

/** Counters of the broker client, for status pages and tests. */
export interface BrokerClientStats {
  /** Offers taken (first offer of a want). */
  accepted: number;
  /** Surplus offers declined at once (a want already won elsewhere, or withdrawn). */
  declined: number;
  /**
   * Surplus offers taken by another want parked on the same connection (same service, at
   * least the same priority) instead of being declined: the connection keeps its turn.
   */
  substituted: number;
  /** Wants that gave up without an offer. */
  noSlot: number;
  /** Slots won by polling an address's token protocol. */
  polled: number;
  /** GET /token requests sent while polling. */
  tokenRequests: number;
}

/** The broker client's lifecycle events, event name → listener arguments. */
export interface BrokerClientEvents {
  /** The reachable instances or one of their HELLOs changed. */
  instances: [];
  /** A connection got its first HELLO: it reaches `instanceId` and parks wants. */
  "connection:up": [conn: BrokerConnection, instanceId: string];
  /** A ready connection's stream ended (it reconnects unless closed). */
  "connection:down": [conn: BrokerConnection, error: Error | undefined];
  /** A want was parked on a connection (sent now, or on the next stream's HELLO). */
  "want:parked": [jobId: string, service: string, conn: BrokerConnection];
  /** The first OFFER of a want won: the caller holds the slot. */
  "offer:accepted": [slot: Slot];
  /** A polled address granted a token first: the caller holds that slot. */
  "token:won": [slot: PolledSlot];
  /** An address pool switched between broker streams and polling its token protocol. */
  "pool:transport": [address: string, transport: PoolTransport];
  /** A surplus OFFER (its want won elsewhere, or was withdrawn) was declined at once. */
  "offer:declined": [jobId: string, conn: BrokerConnection];
  /** No offer came within connectTimeout; the want was withdrawn everywhere. */
  "want:no-slot": [jobId: string, service: string];
  /** DONE arrived for a job this client sent. */
  "job:done": [jobId: string, receipt: Receipt];
  /** The connection running these jobs dropped; the execserver cancels them. */
  "job:lost": [jobIds: readonly string[], error: Error];
}
