import { create } from "@bufbuild/protobuf";
import { ErrorKind, ReceiptSchema, type Receipt } from "../../../gen/slotbroker/v1/broker_pb.js";
import { durationFromMs } from "@bufbuild/protobuf/wkt";

/** A reason a job failed other than its own exit status; the first one recorded wins. */
export interface JobFailure {
  readonly kind: ErrorKind;
  readonly message: string;
}

/** Everything known about a job that was started, once it is over. */
export interface JobOutcome {
  /** Exit code, or null when the process ended by a signal. */
  readonly exitCode: number | null;
  /** Signal name that ended the process, or null. */
  readonly signal: string | null;
  readonly durationMs: number;
  /** The first failure the runner saw or caused (timeout, cancel, pipe), if any. */
  readonly failure?: JobFailure;
  readonly stderrLine: string;
  readonly stdoutPrefix: Uint8Array;
  readonly stdoutBytes: number;
  /** True when stdout went (or started to go) to the stdout URL. */
  readonly stdoutStreamed: boolean;
  /** True when a started upload was aborted instead of completed. */
  readonly uploadAborted: boolean;
}

/**
 * The receipt for a job that ran. The error is the runner's own failure when there was
 * one (it caused any kill, so a SIGTERM after a timeout is TIMEOUT, not KILLED); else a
 * signal nobody here sent is KILLED; else the exit code speaks for itself.
 */
export function receiptFromOutcome(outcome: JobOutcome): Receipt {
  const { failure, signal, exitCode } = outcome;
  let error = ErrorKind.UNSPECIFIED;
  let message = "";
  if (failure) {
    error = failure.kind;
    message = failure.message;
  } else if (signal !== null) {
    error = ErrorKind.KILLED;
    message = `killed by ${signal}`;
  }
  // The exit code has its own field: saying it here too made "exited with code 3: exited
  // with code 3; …" wherever a receipt is described.
  if (outcome.uploadAborted) message += `${message ? "; " : ""}stdout upload aborted after ${outcome.stdoutBytes} bytes`;
  // No conditional spread here: in this hot spot it cost ~15 µs per receipt; create() skips
  // a null field, so exitCode stays unset after a signal.
  return create(ReceiptSchema, {
    exitCode: exitCode ?? undefined,
    signal: signal ?? "",
    // Whole milliseconds: a Duration's nanos must be an integer on the wire.
    duration: durationFromMs(Math.round(outcome.durationMs)),
    stderrLine: outcome.stderrLine,
    stdoutPrefix: outcome.stdoutPrefix,
    stdoutBytes: BigInt(outcome.stdoutBytes),
    stdoutStreamed: outcome.stdoutStreamed,
    error,
    errorMessage: message,
  });
}

/** The receipt for a job that never ran (could not start, bad pipe URL, cancelled first). */
export function receiptNotRun(failure: JobFailure): Receipt {
  return create(ReceiptSchema, {
    duration: durationFromMs(0),
    error: failure.kind,
    errorMessage: failure.message,
  });
}
