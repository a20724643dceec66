import { Code, SlotbrokerError, type ErrorOptions } from "../../shared/errors.js";

/** Why a pipe could not be used or did not complete. */
export type PipeErrorKind = "not-found" | "used" | "busy" | "expired" | "cancelled" | "aborted" | "closed";

// The Connect/gRPC code follows from the kind: an id nobody knows is NOT_FOUND, a pipe
// that existed but can no longer be served is FAILED_PRECONDITION (HTTP 410 on raw routes).
const codes: Record<PipeErrorKind, Code> = {
  "not-found": Code.NotFound,
  used: Code.FailedPrecondition,
  // Another request streams this pipe right now (HTTP 409 on raw routes).
  busy: Code.AlreadyExists,
  expired: Code.FailedPrecondition,
  cancelled: Code.FailedPrecondition,
  aborted: Code.Aborted,
  closed: Code.Unavailable,
};

/** A pipe failure, typed by `kind`; `code` is the matching Connect/gRPC code. */
export class PipeError extends SlotbrokerError {
  override name = "PipeError";
  readonly kind: PipeErrorKind;

  constructor(kind: PipeErrorKind, message: string, options: ErrorOptions = {}) {
    super(codes[kind], message, options);
    this.kind = kind;
  }
}

/** True when `err` is a PipeError of one of `kinds` (any kind when none are given). */
export function isPipeError(err: unknown, ...kinds: PipeErrorKind[]): err is PipeError {
  return err instanceof PipeError && (kinds.length === 0 || kinds.includes(err.kind));
}

/** Wraps whatever stopped a transfer into the pipe's "aborted" error (a PipeError as is). */
export function abortError(cause: unknown): PipeError {
  if (cause instanceof PipeError) return cause;
  const reason = cause instanceof Error ? cause.message : String(cause);
  return new PipeError("aborted", `pipe aborted: ${reason}`, { cause });
}
