/**
 * What an operator reads at the default level (info) about the broker's work: offers that
 * expired unanswered and jobs that failed (warn for timeouts, kills, spawn and pipe errors;
 * info for a non-zero exit or a job cancelled because its stream went); every finished job
 * at debug. Subscribes to the execserver's events; repeats are capped per kind, so a
 * misbehaving client cannot flood the log. Connections and rejects are logged by the session.
 */
import { ErrorKind, type Receipt } from "../../gen/slotbroker/v1/broker_pb.js";
import type { Events } from "../shared/events.js";
import { LogBudget, type Logger } from "../shared/log.js";
import type { JobRecord } from "./broker-core.js";
import type { ExecserverEvents } from "./events.js";

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
