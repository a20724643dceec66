/**
 * The execserver's lifecycle events (see Execserver.events). Metrics, status pages and
 * tests subscribe; the grant path only pays for the listeners there are.
 */
import type { Receipt } from "../../gen/slotbroker/v1/broker_pb.js";
import type { ClientConnection, JobRecord, OfferOutcome } from "./broker-core.js";
import type { LegacyToken } from "./legacy/tokens.js";

/** Lifecycle of an execserver. */
export type ExecserverState = "created" | "serving" | "draining" | "stopped";

/** Event name → listener arguments. */
export interface ExecserverEvents {
  /** The lifecycle moved. */
  state: [state: ExecserverState, previous: ExecserverState];
  /** A client's broker stream opened (its HELLO is on the way). */
  "connection:up": [conn: ClientConnection];
  /** A client's broker stream ended; its wants are gone and its running jobs cancelled. */
  "connection:down": [conn: ClientConnection, reason: string];
  /** A slot was reserved for this want and OFFERed (record.wantedAt → now is the grant latency). */
  offered: [record: JobRecord];
  /** An offer ended: accepted (JOB), declined, expired, withdrawn or dropped. */
  "offer:ended": [record: JobRecord, outcome: OfferOutcome];
  /** The job of an accepted offer started. */
  "job:started": [record: JobRecord];
  /** A running job is being stopped: its fylr sent Cancel, or its connection dropped. */
  "job:cancel": [record: JobRecord, why: "disconnected" | "requested"];
  /** The job finished; DONE with this receipt goes to its connection if it is still open. */
  "job:done": [record: JobRecord, receipt: Receipt];
  /** The legacy token protocol answered a request (endpoint "token" or "job"; 499: the client went away). */
  "legacy:request": [endpoint: string, status: number];
  /** A redeemed legacy token's job started in its slot. */
  "legacy:started": [token: LegacyToken];
  /** A legacy job finished; its slot is free. */
  "legacy:done": [token: LegacyToken, receipt: Receipt];
}
