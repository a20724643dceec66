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
 * Jobs sent with JOB and not yet DONE, by connection and job id: the same id may run on two
 * connections at once (a want's own offer on one instance, and a surplus offer for it that
 * another want took on a second — see BrokerClient.onOffer). DONE settles a job only when
 * it arrives on the connection that runs it; a lost connection or a Reject fails it.
 */
export class RunningJobs {
  private readonly jobs = new Map<BrokerConnection, Map<string, TrackedJob>>();
  private count = 0;

  /** Jobs waiting for DONE. */
  get size(): number {
    return this.count;
  }

  /** Registers a job about to be sent on `conn`; resolves with its receipt. */
  track(jobId: string, conn: BrokerConnection, instanceId: string): Promise<Receipt> {
    return new Promise<Receipt>((resolve, reject) => {
      let onConn = this.jobs.get(conn);
      if (!onConn) this.jobs.set(conn, (onConn = new Map<string, TrackedJob>()));
      if (!onConn.has(jobId)) this.count++;
      onConn.set(jobId, { conn, instanceId, resolve, reject });
    });
  }

  /** Stops waiting for `jobId` on `conn` (its caller gave up); a later DONE is ignored. */
  forget(conn: BrokerConnection, jobId: string, err: Error): void {
    const job = this.take(conn, jobId);
    if (!job) return;
    conn.forgetJob(jobId);
    job.reject(err);
  }

  /** True when `jobId` runs on `conn`. */
  runsOn(jobId: string, conn: BrokerConnection): boolean {
    return this.jobs.get(conn)?.has(jobId) ?? false;
  }

  /** DONE arrived on `conn`; returns the receipt it settled the job with (undefined: not ours). */
  done(conn: BrokerConnection, jobId: string, receipt: Receipt | undefined, emptyReceipt: () => Receipt): Receipt | undefined {
    const job = this.take(conn, jobId);
    if (!job) return undefined;
    const settled = receipt ?? emptyReceipt();
    job.resolve(settled);
    return settled;
  }

  /** The stream of `conn` dropped while these jobs ran. */
  lost(conn: BrokerConnection, jobIds: readonly string[], cause: Error): void {
    for (const jobId of jobIds) {
      const job = this.take(conn, jobId);
      job?.reject(new ConnectionLostError(jobId, job.instanceId, conn.address, cause));
    }
  }

  /** The execserver rejected a frame of a running job (e.g. JOB after the offer expired). */
  rejected(conn: BrokerConnection, reject: Reject): boolean {
    const job = this.take(conn, reject.jobId);
    if (!job) return false;
    const name = RejectCode[reject.code] ?? String(reject.code);
    job.reject(new JobRejectedError(reject.jobId, name, reject.message, rejectCodes[reject.code] ?? Code.FailedPrecondition));
    return true;
  }

  private take(conn: BrokerConnection, jobId: string): TrackedJob | undefined {
    const onConn = this.jobs.get(conn);
    const job = onConn?.get(jobId);
    if (!job) return undefined;
    onConn!.delete(jobId);
    if (onConn!.size === 0) this.jobs.delete(conn);
    this.count--;
    return job;
  }
}
