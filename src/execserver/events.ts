/**
 * The execserver's lifecycle events (see Execserver.events). Metrics, status pages and
 * tests subscribe; the grant path only pays for the listeners there are. The log lines an
 * operator reads about the broker's work come from them too (logExecserverEvents).
 */
import { ErrorKind, type Receipt } from "../../gen/slotbroker/v1/broker_pb.js";
import type { Events } from "../shared/typed-events.js";
import { LogBudget, type Logger } from "../shared/log.js";
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

// --- the log -------------------------------------------------------------------------
//
// What an operator reads at the default level (info) about the broker's work: offers that
// expired unanswered and jobs that failed (warn for timeouts, kills, spawn and pipe errors;
// info for a non-zero exit or a job cancelled because its stream went); every finished job
// at debug. Subscribes to the execserver's events; repeats are capped per kind, so a
// misbehaving client cannot flood the log. Connections and rejects are logged by the session.

/** Logs expired offers and job outcomes; returns the function that stops it. */
export function logExecserverEvents(events: Events<ExecserverEvents>, logger: Logger): () => void {
  const failures = new LogBudget(50, 10_000);
  const expiries = new LogBudget(10, 10_000);
  const stops = [
    events.on("offer:ended", (record, outcome) => {
      if (outcome !== "expired") return;
      const left = expiries.take();
      if (left === undefined) return;
      logger.info(
        { jobId: record.jobId, conn: record.connection.id, waitgroup: record.group.name, notLogged: left || undefined },
        "offer expired unanswered; the slot goes to the next want",
      );
    }),
    events.on("job:done", (record, receipt) => logOutcome(logger, failures, record, receipt)),
  ];
  return () => stops.forEach((stop) => stop());
}

function logOutcome(logger: Logger, budget: LogBudget, record: JobRecord, receipt: Receipt): void {
  const failed = receipt.error !== ErrorKind.UNSPECIFIED || (receipt.exitCode ?? 0) !== 0 || receipt.signal !== "";
  const level = !failed ? "debug" : receipt.error === ErrorKind.UNSPECIFIED || receipt.error === ErrorKind.CANCELLED ? "info" : "warn";
  if (!logger.isLevelEnabled(level)) return;
  const left = failed ? budget.take() : 0;
  if (left === undefined) return;
  logger[level](
    {
      jobId: record.jobId,
      service: record.service.name,
      conn: record.connection.id,
      jobPid: record.jobPid || undefined,
      exitCode: receipt.exitCode,
      signal: receipt.signal || undefined,
      error: receipt.error === ErrorKind.UNSPECIFIED ? undefined : ErrorKind[receipt.error],
      message: receipt.errorMessage || undefined,
      stderr: receipt.stderrLine || undefined,
      ms: receipt.duration ? Number(receipt.duration.seconds) * 1000 + Math.round(receipt.duration.nanos / 1e6) : undefined,
      notLogged: left || undefined,
    },
    failed ? "job failed" : "job done",
  );
}
