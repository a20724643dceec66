import { Code, ConnectError } from "@connectrpc/connect";

export { Code };

/** Options for a SlotbrokerError: the underlying cause and structured details. */
export interface ErrorOptions {
  cause?: unknown;
  details?: Record<string, unknown>;
}

/**
 * The project's one error type. `code` uses the gRPC status codes (Connect's `Code` enum
 * has the same numbers), so it maps onto grpc-js and Connect responses without a table.
 */
export class SlotbrokerError extends Error {
  override name = "SlotbrokerError";
  readonly code: Code;
  readonly details: Record<string, unknown>;

  constructor(code: Code, message: string, options: ErrorOptions = {}) {
    super(message, options.cause === undefined ? undefined : { cause: options.cause });
    this.code = code;
    this.details = options.details ?? {};
  }

  /** Normalises anything thrown into a SlotbrokerError, keeping the original as cause. */
  static from(err: unknown, fallback: Code = Code.Unknown): SlotbrokerError {
    if (err instanceof SlotbrokerError) return err;
    if (isAbortError(err)) return new SlotbrokerError(Code.Canceled, abortMessage(err), { cause: err });
    if (err instanceof Error) {
      const mapped = nodeErrorCode(err);
      return new SlotbrokerError(mapped ?? fallback, err.message, { cause: err });
    }
    return new SlotbrokerError(fallback, String(err));
  }
}

/** Invalid configuration; the message names the offending key. */
export class ConfigError extends SlotbrokerError {
  override name = "ConfigError";
  constructor(message: string, options: ErrorOptions = {}) {
    super(Code.InvalidArgument, message, options);
  }
}

/** True for DOMException AbortError / TimeoutError and Node's ABORT_ERR. */
export function isAbortError(err: unknown): boolean {
  if (typeof err !== "object" || err === null) return false;
  const e = err as { name?: unknown; code?: unknown };
  return e.name === "AbortError" || e.name === "TimeoutError" || e.code === "ABORT_ERR";
}

/** Maps anything thrown to a ConnectError with the same code (Connect's Code is gRPC's). */
export function toConnectError(err: unknown): ConnectError {
  if (err instanceof ConnectError) return err;
  const e = SlotbrokerError.from(err, Code.Internal);
  return new ConnectError(e.message, e.code, undefined, undefined, err);
}

function abortMessage(err: unknown): string {
  const e = err as { message?: unknown; cause?: unknown };
  return typeof e.message === "string" && e.message ? e.message : "operation was aborted";
}

// Node socket errors are translated here, once, at the edge.
const nodeCodes: Record<string, Code> = {
  ECONNREFUSED: Code.Unavailable,
  ECONNRESET: Code.Unavailable,
  EPIPE: Code.Unavailable,
  ETIMEDOUT: Code.DeadlineExceeded,
  EHOSTUNREACH: Code.Unavailable,
  ENETUNREACH: Code.Unavailable,
  ENOTFOUND: Code.Unavailable,
  EADDRINUSE: Code.FailedPrecondition,
  EACCES: Code.PermissionDenied,
  ENOENT: Code.NotFound,
  ERR_STREAM_PREMATURE_CLOSE: Code.Aborted,
  UND_ERR_SOCKET: Code.Unavailable,
};

function nodeErrorCode(err: Error): Code | undefined {
  const code = (err as { code?: unknown }).code;
  return typeof code === "string" ? nodeCodes[code] : undefined;
}
