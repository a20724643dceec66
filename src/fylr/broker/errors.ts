import { formatDuration } from "../../shared/duration.js";
import { Code, SlotbrokerError } from "../../shared/errors.js";

/**
 * No execserver offered a slot within connectTimeout; the want was UNWANTed everywhere.
 * Code RESOURCE_EXHAUSTED: callers elsewhere (the dispatcher requeues the item) go by the
 * code, never by this class.
 */
export class NoSlotError extends SlotbrokerError {
  override name = "NoSlotError";

  constructor(
    readonly service: string,
    readonly waitedMs: number,
    /** Distinct instances the want was parked on when it gave up. */
    readonly instances: number,
  ) {
    super(
      Code.ResourceExhausted,
      `no slot for service "${service}" within ${formatDuration(waitedMs)} on ${instances} instance${instances === 1 ? "" : "s"}`,
      { details: { service, waitedMs, instances } },
    );
  }
}

/** No connected execserver lists the service in its HELLO: failing fast beats waiting. */
export class UnknownServiceError extends SlotbrokerError {
  override name = "UnknownServiceError";
  constructor(
    readonly service: string,
    offered: readonly string[],
    instances: number,
  ) {
    const list = offered.length > 0 ? offered.map((s) => `"${s}"`).join(", ") : "none";
    super(
      Code.FailedPrecondition,
      `no execserver offers service "${service}" (${instances} connected instance${instances === 1 ? "" : "s"} offer: ${list})`,
      { details: { service, offered, instances } },
    );
  }
}

/**
 * The broker connection that ran (or was about to run) a job dropped. A live execserver
 * cancels the job when it sees the stream end; a dead one took the job with it (its
 * per-job watchdog kills the process group).
 */
export class ConnectionLostError extends SlotbrokerError {
  override name = "ConnectionLostError";
  constructor(jobId: string, instanceId: string, address: string, cause?: unknown) {
    super(
      Code.Unavailable,
      `broker connection to execserver ${instanceId} (${address}) was lost while job ${jobId} was running; a live execserver cancels the job, a dead one took it down with it`,
      { cause, details: { jobId, instanceId, address } },
    );
  }
}

/** The execserver answered a frame of this job with a Reject. */
export class JobRejectedError extends SlotbrokerError {
  override name = "JobRejectedError";
  constructor(
    jobId: string,
    readonly rejectCode: string,
    message: string,
    code: Code,
  ) {
    super(code, `execserver rejected job ${jobId}: ${rejectCode}: ${message}`, { details: { jobId, rejectCode } });
  }
}
