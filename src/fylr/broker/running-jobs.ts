import type { Receipt, Reject } from "../../../gen/slotbroker/v1/broker_pb.js";
import { RejectCode } from "../../../gen/slotbroker/v1/broker_pb.js";
import { Code } from "../../shared/errors.js";
import type { BrokerConnection } from "./connection.js";
import { ConnectionLostError, JobRejectedError } from "./errors.js";

interface TrackedJob {
  readonly conn: BrokerConnection;
  readonly instanceId: string;
  readonly resolve: (receipt: Receipt) => void;
  readonly reject: (err: Error) => void;
}

const rejectCodes: Partial<Record<RejectCode, Code>> = {
  [RejectCode.STALE_OFFER]: Code.Aborted,
  [RejectCode.INVALID_ARGUMENT]: Code.InvalidArgument,
  [RejectCode.DUPLICATE_JOB]: Code.AlreadyExists,
  [RejectCode.DRAINING]: Code.Unavailable,
};

/**
 * Jobs sent with JOB and not yet DONE, by job id. DONE settles a job only when it arrives
 * on the connection that runs it; a lost connection or a Reject fails it.
 */
export class RunningJobs {
  private readonly jobs = new Map<string, TrackedJob>();

  /** Jobs waiting for DONE. */
  get size(): number {
    return this.jobs.size;
  }

  /** Registers a job about to be sent on `conn`; resolves with its receipt. */
  track(jobId: string, conn: BrokerConnection, instanceId: string): Promise<Receipt> {
    return new Promise<Receipt>((resolve, reject) => {
      this.jobs.set(jobId, { conn, instanceId, resolve, reject });
    });
  }

  /** Stops waiting for `jobId` (its caller gave up); a later DONE is ignored. */
  forget(jobId: string, err: Error): void {
    const job = this.jobs.get(jobId);
    if (!job) return;
    this.jobs.delete(jobId);
    job.conn.forgetJob(jobId);
    job.reject(err);
  }

  /** True when `jobId` runs on `conn`. */
  runsOn(jobId: string, conn: BrokerConnection): boolean {
    return this.jobs.get(jobId)?.conn === conn;
  }

  /** DONE arrived on `conn`; returns the receipt it settled the job with (undefined: not ours). */
  done(conn: BrokerConnection, jobId: string, receipt: Receipt | undefined, emptyReceipt: () => Receipt): Receipt | undefined {
    const job = this.jobs.get(jobId);
    if (!job || job.conn !== conn) return undefined;
    this.jobs.delete(jobId);
    const settled = receipt ?? emptyReceipt();
    job.resolve(settled);
    return settled;
  }

  /** The stream of `conn` dropped while these jobs ran. */
  lost(conn: BrokerConnection, jobIds: readonly string[], cause: Error): void {
    for (const jobId of jobIds) {
      const job = this.jobs.get(jobId);
      if (!job || job.conn !== conn) continue;
      this.jobs.delete(jobId);
      job.reject(new ConnectionLostError(jobId, job.instanceId, conn.address, cause));
    }
  }

  /** The execserver rejected a frame of a running job (e.g. JOB after the offer expired). */
  rejected(conn: BrokerConnection, reject: Reject): boolean {
    const job = this.jobs.get(reject.jobId);
    if (!job || job.conn !== conn) return false;
    this.jobs.delete(reject.jobId);
    const name = RejectCode[reject.code] ?? String(reject.code);
    job.reject(new JobRejectedError(reject.jobId, name, reject.message, rejectCodes[reject.code] ?? Code.FailedPrecondition));
    return true;
  }
}
