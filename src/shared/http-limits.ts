/**
 * Limits every HTTP listener of slotbroker applies against slow or greedy clients: a
 * deadline for a request's headers (also the idle time of a kept-alive connection), a
 * deadline and a minimum rate for its body, a cap on open connections, and a cap on a
 * Connect/JSON request message.
 */
import { z } from "zod";
import { byteSize, durationMs } from "./config-parsing.js";

/** Compiled HTTP limits. */
export interface HttpLimits {
  /** A connection must send a request's complete headers within this time (default 20 s). */
  readonly headersTimeoutMs: number;
  /** A kept-alive connection with no request in flight is closed after this time (default 60 s). */
  readonly idleTimeoutMs: number;
  /** Open connections at most; more are closed at once (default 4096). */
  readonly maxConnections: number;
  /** A request body's slack: it may fall this far behind bodyMinRate, or send nothing this long (default 30 s). */
  readonly bodyTimeoutMs: number;
  /** Bytes per second a request body must keep up on average; 0: the whole body within bodyTimeoutMs (default 4 KiB). */
  readonly bodyMinRate: number;
  /** Largest Connect/gRPC/JSON request message (default 16 MiB; the store upload route has its own limits). */
  readonly maxRequestBytes: number;
}

// The keys every listener has.
const connectionKeys = {
  headersTimeout: durationMs.prefault("20s"),
  idleTimeout: durationMs.prefault("60s"),
  maxConnections: z.number().int().min(1).max(1_000_000).default(4096),
  bodyTimeout: durationMs.prefault("30s"),
  bodyMinRate: byteSize.prefault("4KiB"),
};

function checkConnectionKeys(c: { headersTimeout: number; idleTimeout: number; bodyTimeout: number }, ctx: z.RefinementCtx): void {
  for (const key of ["headersTimeout", "idleTimeout", "bodyTimeout"] as const) {
    if (c[key] <= 0) ctx.addIssue({ code: "custom", path: [key], message: "must be longer than 0" });
  }
}

/** The YAML shape (`http:` in the fylr config, `adminHttp:` in the execserver's). */
export const httpLimitsSchema = z
  .strictObject({ ...connectionKeys, maxRequestBytes: byteSize.prefault("16MiB") })
  .superRefine((c, ctx) => {
    checkConnectionKeys(c, ctx);
    if (c.maxRequestBytes < 64 * 1024) ctx.addIssue({ code: "custom", path: ["maxRequestBytes"], message: "must be at least 64KiB" });
  })
  .transform(
    (c): HttpLimits => ({
      headersTimeoutMs: c.headersTimeout,
      idleTimeoutMs: c.idleTimeout,
      maxConnections: c.maxConnections,
      bodyTimeoutMs: c.bodyTimeout,
      bodyMinRate: c.bodyMinRate,
      maxRequestBytes: c.maxRequestBytes,
    }),
  );

/** The defaults. */
export const defaultHttpLimits: HttpLimits = httpLimitsSchema.parse({});

/** Limits of a listener that serves no Connect messages (the execserver's admin port). */
export type ConnectionLimits = Omit<HttpLimits, "maxRequestBytes">;

/** The YAML shape of `adminHttp:` in the execserver config. */
export const connectionLimitsSchema = z
  .strictObject(connectionKeys)
  .superRefine(checkConnectionKeys)
  .transform(
    (c): ConnectionLimits => ({
      headersTimeoutMs: c.headersTimeout,
      idleTimeoutMs: c.idleTimeout,
      maxConnections: c.maxConnections,
      bodyTimeoutMs: c.bodyTimeout,
      bodyMinRate: c.bodyMinRate,
    }),
  );

/** The defaults of a ConnectionLimits. */
export const defaultConnectionLimits: ConnectionLimits = connectionLimitsSchema.parse({});
