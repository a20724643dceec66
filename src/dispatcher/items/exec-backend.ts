/**
 * The exec backend: how the dispatcher runs one exec call on some execserver.
 *
 * The fylr's exec client implements this (WANT on every eligible connection, first OFFER
 * wins, JOB with pipe URLs, DONE → receipt). Keeping it an interface lets the dispatcher be
 * built and tested before the broker client exists.
 */
import type { Readable, Writable } from "node:stream";
import type { Position, Receipt } from "../../../gen/slotbroker/v1/broker_pb.js";

/** One exec call as the backend receives it; stdin is already resolved. */
export interface ExecRequest {
  /** The service to run; the execserver's config fixes the executable. */
  readonly service: string;
  /** Appended to the service's command. Never run through a shell. */
  readonly args: readonly string[];
  /** Environment for the process; the execserver filters it by the service's allow-list. */
  readonly env: Readonly<Record<string, string>>;
  /** Job timeout; unset uses the service's own. */
  readonly timeoutMs?: number;
  /**
   * stdin: bytes to serve through an in-pipe (inline data, a small previous stdout), a
   * stream (a stored upload or stored previous stdout, read lazily when the job reads its
   * in-pipe), or a URL the fylr fetches and streams to the job. Unset means empty stdin.
   */
  readonly stdin?: Buffer | URL | Readable;
  /** The W3C traceparent the job continues (JOB's traceparent); unset when untraced. */
  readonly traceparent?: string;
}

/** Per-call options the dispatcher passes along. */
export interface ExecRunOptions {
  /** WANT priority; larger is more urgent. The item's queue priority. */
  readonly priority: number;
  /** WANT fairness key: the item's key ("" or unset: the default key). */
  readonly fairnessKey?: string;
  /** WANT fairness weight: the item's weight (unset: 1). */
  readonly fairnessWeight?: number;
  /**
   * Aborted when the dispatcher gives the item up (shutdown past its grace period, or this
   * fylr was declared dead by a sibling). The backend must UNWANT / stop waiting and reject
   * promptly with an abort error (the signal's reason is fine).
   */
  readonly signal: AbortSignal;
  /**
   * Makes the stream the job's stdout goes to, all of it, streamed: the backend ends it
   * after the last byte and destroys it when the upload failed. A backend that cannot
   * stream, or got the whole output with the receipt, does not call it and returns the
   * bytes in ExecResult.stdout instead.
   */
  readonly stdout?: () => Writable;
  /** Without `stdout`: the most stdout the backend needs to collect. */
  readonly maxStdoutBytes: number;
  /** Called with each POSITION the execserver reports while the want is parked. */
  readonly onPosition?: (position: Position) => void;
  /**
   * Called once when a slot was granted and the job was sent (JOB), with the instance that
   * runs it and the waitgroup whose slot it took. The dispatcher marks the item running in
   * the database then.
   */
  readonly onStart?: (instanceId: string, waitgroup?: string) => void;
}

/** What one exec call produced. */
export interface ExecResult {
  /** The execserver's receipt, also for a failed command: failure is data, not an exception. */
  readonly receipt: Receipt;
  /** The whole stdout when it was not written to a stream of ExecRunOptions.stdout (else empty). */
  readonly stdout: Buffer;
}

/**
 * Runs exec calls for the dispatcher.
 *
 * Contract for implementers:
 * - resolve with the receipt whenever the command ran (or was spawned and failed): a
 *   non-zero exit, a signal or a receipt error is a *result*; the dispatcher decides about
 *   retries;
 * - reject with a SlotbrokerError of code RESOURCE_EXHAUSTED when no slot was offered
 *   within connectTimeout (after UNWANTing everywhere): the dispatcher requeues the item a
 *   minute out and gives its attempt back. The code is the contract, not the class: the
 *   backend lives in another part of the program and shares only `src/shared` with this one;
 * - reject with an abort error when `signal` aborts;
 * - reject with any other error for a transport failure (connection lost mid-job, pipe
 *   failure before a receipt): the dispatcher counts it as a failed attempt and retries.
 */
export interface ExecBackend {
  /** Runs one exec call to completion. */
  run(request: ExecRequest, options: ExecRunOptions): Promise<ExecResult>;
}
