/**
 * Postgres errors become SlotbrokerErrors here, once. Callers above the queue store and the
 * store see gRPC-style codes (UNAVAILABLE, ALREADY_EXISTS, …) and never parse SQLSTATEs
 * themselves.
 */
import { Code, SlotbrokerError, isAbortError } from "../../shared/errors.js";

// Exact SQLSTATEs first, then by class (the first two characters).
const bySqlState: Record<string, Code> = {
  "23505": Code.AlreadyExists, // unique_violation
  "23503": Code.FailedPrecondition, // foreign_key_violation
  "23514": Code.InvalidArgument, // check_violation
  "23502": Code.InvalidArgument, // not_null_violation
  "22P02": Code.InvalidArgument, // invalid_text_representation, e.g. a malformed uuid
  "22003": Code.InvalidArgument, // numeric_value_out_of_range
  "40001": Code.Aborted, // serialization_failure
  "40P01": Code.Aborted, // deadlock_detected
  "55P03": Code.Aborted, // lock_not_available
  "57014": Code.DeadlineExceeded, // query_canceled (statement_timeout)
  "57P01": Code.Unavailable, // admin_shutdown
  "57P02": Code.Unavailable, // crash_shutdown
  "57P03": Code.Unavailable, // cannot_connect_now (starting up)
  "53300": Code.ResourceExhausted, // too_many_connections
  "53100": Code.ResourceExhausted, // disk_full
  "42P01": Code.FailedPrecondition, // undefined_table: migrations not applied
  "42703": Code.FailedPrecondition, // undefined_column: schema older than the code
  "3D000": Code.NotFound, // invalid_catalog_name: the database does not exist
  "28P01": Code.Unauthenticated, // invalid_password
  "28000": Code.PermissionDenied, // invalid_authorization_specification
  "42501": Code.PermissionDenied, // insufficient_privilege
};

const byClass: Record<string, Code> = {
  "08": Code.Unavailable, // connection exception
  "53": Code.ResourceExhausted, // insufficient resources
  "57": Code.Unavailable, // operator intervention
  "58": Code.Internal, // system error
  "XX": Code.Internal, // internal error
};

const hints: Record<string, string> = {
  "42P01": " (is the schema migrated? run `slotbroker migrate`)",
  "42703": " (is the schema migrated? run `slotbroker migrate`)",
};

const closedByUs = /after calling end on the pool|Client was closed and is not queryable/;

/** The SQLSTATE of a node-postgres error, if it is one. */
export function sqlState(err: unknown): string | undefined {
  if (typeof err !== "object" || err === null) return undefined;
  const code = (err as { code?: unknown }).code;
  return typeof code === "string" && /^[0-9A-Z]{5}$/.test(code) ? code : undefined;
}

/**
 * Translates anything a pg query threw. `what` names the operation for the message
 * ("claim", "submit"). Abort errors and SlotbrokerErrors pass through unchanged.
 */
export function fromPgError(err: unknown, what: string): unknown {
  if (err instanceof SlotbrokerError || isAbortError(err)) return err;
  const state = sqlState(err);
  if (state === undefined && err instanceof Error && closedByUs.test(err.message)) {
    // Our own pool or client was shut down: retrying cannot help.
    return new SlotbrokerError(Code.FailedPrecondition, `${what}: ${err.message}`, { cause: err });
  }
  if (state === undefined) {
    // Socket-level failures (ECONNREFUSED, ECONNRESET…) are mapped by SlotbrokerError.from;
    // pg's own "Connection terminated" errors carry no code and mean the same thing.
    const e = SlotbrokerError.from(err, Code.Unavailable);
    return new SlotbrokerError(e.code, `${what}: ${e.message}`, { cause: err });
  }
  const code = bySqlState[state] ?? byClass[state.slice(0, 2)] ?? Code.Internal;
  const message = err instanceof Error ? err.message : String(err);
  return new SlotbrokerError(code, `${what}: ${message}${hints[state] ?? ""}`, { cause: err, details: { sqlState: state } });
}

/** True for errors worth retrying after a pause (the database is down, restarting, overloaded). */
export function isTransient(err: unknown): boolean {
  const code = err instanceof SlotbrokerError ? err.code : undefined;
  return code === Code.Unavailable || code === Code.Aborted || code === Code.ResourceExhausted || code === Code.DeadlineExceeded;
}
