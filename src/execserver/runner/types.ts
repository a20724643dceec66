import type { EventEmitter } from "node:events";
import type { Readable, Writable } from "node:stream";
import type { Receipt } from "../../../gen/slotbroker/v1/broker_pb.js";

/** Everything the runner needs to run one job; built by the session from config + JobSpec. */
export interface RunRequest {
  /** The service's configured argv (executable first); never run through a shell. */
  readonly command: readonly string[];
  /** JobSpec.args, appended to `command`. */
  readonly args: readonly string[];
  /** Environment for the process, already filtered by the service's allow-list. */
  readonly env: Readonly<Record<string, string>>;
  /** Kill after this long: SIGTERM to the process group, then SIGKILL after killGraceMs. */
  readonly timeoutMs: number;
  /** Delay between SIGTERM and SIGKILL (default 2000). */
  readonly killGraceMs?: number;
  /** Delay between SIGTERM and SIGKILL when the job is stopped by a cancel request (default killGraceMs). */
  readonly cancelGraceMs?: number;
  /** HTTP(S) URL to GET stdin from; empty stdin when unset. */
  readonly stdinUrl?: string;
  /** The whole stdin (JobSpec.stdin_inline): written to the process and closed, no request. */
  readonly stdinInline?: Uint8Array;
  /** HTTP(S) URL to PUT stdout to (chunked) once it passes the 4000-byte buffer. */
  readonly stdoutUrl?: string;
  /** CA certificates trusted for https pipe URLs instead of the system's (pipes.caFile). */
  readonly pipeCa?: Buffer;
  /** stdin from a stream instead of a URL (the legacy transport's request body); read to its end. */
  readonly stdin?: Readable;
  /**
   * stdout into a stream instead of a URL (the legacy transport's response): written once
   * the output passes the 4000-byte buffer, destroyed on failure, never ended by the runner.
   */
  readonly stdout?: Writable;
  /** Directory under which the per-job temp working dir is made (default os.tmpdir()). */
  readonly tempRoot?: string;
  /**
   * Aborting cancels the job: the process group is killed, the receipt says CANCELLED, or
   * CANCEL_REQUESTED when the reason is an AbortReason of kind "cancel-requested".
   */
  readonly signal: AbortSignal;
  /** Told the job's process id once it is running, so its outcome can name the process. */
  readonly onSpawn?: (pid: number) => void;
}

/** Runs one job to completion; never rejects — every failure is described in the Receipt. */
export type RunJob = (request: RunRequest) => Promise<Receipt>;

/** Where stdout goes once it outgrows the receipt buffer: the pipe upload or a caller's stream. */
export interface StdoutSink {
  /** True once the first byte went out (the output passed the buffer). */
  readonly started: boolean;
  /** True when a started sink was aborted instead of completed. */
  readonly aborted: boolean;
  /** Sends `data`; resolves when more may be written (backpressure). Dropped after a failure. */
  write(data: Buffer): Promise<void>;
  /** Completes a started sink after a clean success; failures go to the sink's onFail. */
  finish(): Promise<void>;
  /** Breaks a started sink off so the receiver sees an aborted body; idempotent. */
  abort(reason: string): void;
}

/**
 * A running job's process as the runner sees it: a ChildProcess, or a LaunchedProcess
 * started by the job launcher. Events: "exit" and "close" (code, signal), "error", and
 * "lost" (message) when nobody can tell how the job ended any more.
 */
export interface JobProcess extends EventEmitter {
  readonly pid: number;
  /** null when the job has no stdin at all: it reads /dev/null (spawned here without a source). */
  readonly stdin: Writable | null;
  /** null when the job launcher reads stdout itself and tells its first bytes (stdoutKept). */
  readonly stdout: Readable | null;
  /** null when the job launcher reads stderr itself and tells its last line (stderrLine). */
  readonly stderr: Readable | null;
  /** The stderr line of a job whose `stderr` is null, once "close" was emitted. */
  stderrLine?(): string;
  /** Stops waiting for the pipes the runner does not hold (see `stderr`, `stdout`); idempotent. */
  abandonPipes?(): void;
  /** The stdout of a job whose `stdout` is null, once "close" was emitted: first bytes, count. */
  stdoutKept?(): { readonly prefix: Uint8Array; readonly total: number };
  /** The bytes of stdout the job launcher read before it passed `stdout` on (see "spill"). */
  stdoutHead?(): Buffer | undefined;
  /** The reaper that was told of the job's process group already (see GroupWatchdog). */
  readonly watchedBy?: number;
}
