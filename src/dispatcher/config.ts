/**
 * Dispatcher settings: the `dispatcher:` section of the fylr config, validated once into a
 * fully defaulted object. Durations are strings with a unit and compile to `*Ms`.
 *
 * The timing defaults go together: a heartbeat every 1 s and a stale threshold of 15 s
 * means a sibling notices a crashed fylr within ~16 s (threshold + one poll), while a fylr
 * can miss 14 heartbeats in a row (GC pause, slow database) before its claims are taken.
 */
import { availableParallelism } from "node:os";
import { z } from "zod";
import { durationMs, parseConfig } from "../shared/config-parsing.js";
import { normalizeUrlPrefix } from "./queue/stdin-url.js";

/** The compiled dispatcher configuration. */
export interface DispatcherConfig {
  /** How often the loop looks for work without being woken (default 1 s): the safety net under LISTEN/NOTIFY. */
  readonly pollIntervalMs: number;
  /** Wake on LISTEN/NOTIFY when any fylr submits, requeues or finishes an item (default true). */
  readonly listen: boolean;
  /** How often this fylr's row is touched (default 1 s). */
  readonly heartbeatIntervalMs: number;
  /** A fylr whose heartbeat is older is presumed dead; its claims are requeued (default 15 s). */
  readonly staleAfterMs: number;
  /** Pipelining headroom added to each instance's share (default 2). */
  readonly headroom: number;
  /** Local-action slots; 0 means os.availableParallelism() (default 0). */
  readonly localSlots: number;
  /** start_after offset for an item that got no slot in time (default 1 min). */
  readonly noSlotDelayMs: number;
  /** First retry delay after a failed attempt; doubles per attempt (default 1 s). */
  readonly retryInitialMs: number;
  /** Cap on the retry delay (default 5 min). */
  readonly retryMaxMs: number;
  /** Attempts for an item submitted without max_attempts (default 3). */
  readonly maxAttempts: number;
  /** On stop, how long running items may take before they are aborted and given back (default 30 s). */
  readonly stopGraceMs: number;
  /** Inline input per item: stdin data of all calls, or a local action's input (default 4 MiB). */
  readonly maxInputBytes: number;
  /** Stored output per item, and each intermediate stdout (default 16 MiB). */
  readonly maxOutputBytes: number;
  /** Most items one claim query takes (default 100). */
  readonly maxClaimBatch: number;
  /**
   * A running item whose cancel was asked for is cancelled by any fylr after this long
   * even without its job's DONE, e.g. when the fylr holding it is gone (default 30 s).
   */
  readonly cancelBoundMs: number;
  /** URL prefixes a submit's stdin_url must start with; empty allows any http(s) URL (default empty). */
  readonly stdinUrlPrefixes: readonly string[];
  /**
   * How long an exec item's job runs before its 'running' state is written (default 100 ms;
   * 0 writes it as the job starts). A job done sooner goes from claimed straight to its
   * outcome: one statement and one notification to every fylr fewer.
   */
  readonly runningMarkDelayMs: number;
}

const positiveInt = z.number().int().positive();

/** The YAML/env shape of the `dispatcher:` section; every key optional. */
export const dispatcherConfigSchema = z
  .strictObject({
    pollInterval: durationMs.prefault("1s"),
    listen: z.boolean().default(true),
    heartbeatInterval: durationMs.prefault("1s"),
    staleAfter: durationMs.prefault("15s"),
    headroom: z.number().int().min(0).max(1000).default(2),
    localSlots: z.number().int().min(0).max(4096).default(0),
    noSlotDelay: durationMs.prefault("1m"),
    retryInitial: durationMs.prefault("1s"),
    retryMax: durationMs.prefault("5m"),
    maxAttempts: positiveInt.max(1000).default(3),
    stopGrace: durationMs.prefault("30s"),
    maxInputBytes: positiveInt.default(4 << 20),
    maxOutputBytes: positiveInt.default(16 << 20),
    maxClaimBatch: positiveInt.max(10_000).default(100),
    cancelBound: durationMs.prefault("30s"),
    runningMarkDelay: durationMs.prefault("100ms"),
    stdinUrlPrefixes: z
      .array(
        z
          .string()
          .regex(/^https?:\/\/[^/]+\//i, "expected an http(s) URL prefix ending in a path, e.g. https://files.example.com/")
          .transform((prefix, ctx) => {
            const normalized = normalizeUrlPrefix(prefix);
            if ("prefix" in normalized) return normalized.prefix;
            ctx.addIssue({ code: "custom", message: normalized.error });
            return z.NEVER;
          }),
      )
      .default([]),
  })
  .superRefine((c, ctx) => {
    if (c.pollInterval <= 0) ctx.addIssue({ code: "custom", path: ["pollInterval"], message: "must be longer than 0" });
    if (c.heartbeatInterval <= 0) ctx.addIssue({ code: "custom", path: ["heartbeatInterval"], message: "must be longer than 0" });
    if (c.staleAfter < 3 * c.heartbeatInterval) {
      ctx.addIssue({
        code: "custom",
        path: ["staleAfter"],
        message: `must be at least 3 × heartbeatInterval (${3 * c.heartbeatInterval} ms), or live fylrs get declared dead`,
      });
    }
    if (c.cancelBound <= 0) ctx.addIssue({ code: "custom", path: ["cancelBound"], message: "must be longer than 0" });
    if (c.retryMax < c.retryInitial) ctx.addIssue({ code: "custom", path: ["retryMax"], message: "must not be shorter than retryInitial" });
  })
  .transform(
    (c): DispatcherConfig => ({
      pollIntervalMs: c.pollInterval,
      listen: c.listen,
      heartbeatIntervalMs: c.heartbeatInterval,
      staleAfterMs: c.staleAfter,
      headroom: c.headroom,
      localSlots: c.localSlots,
      noSlotDelayMs: c.noSlotDelay,
      retryInitialMs: c.retryInitial,
      retryMaxMs: c.retryMax,
      maxAttempts: c.maxAttempts,
      stopGraceMs: c.stopGrace,
      maxInputBytes: c.maxInputBytes,
      maxOutputBytes: c.maxOutputBytes,
      maxClaimBatch: c.maxClaimBatch,
      cancelBoundMs: c.cancelBound,
      stdinUrlPrefixes: c.stdinUrlPrefixes,
      runningMarkDelayMs: c.runningMarkDelay,
    }),
  );

/** Validates a raw `dispatcher:` section; a ConfigError names the bad key. */
export function compileDispatcherConfig(raw: unknown = {}, source = "dispatcher"): DispatcherConfig {
  return parseConfig(dispatcherConfigSchema, raw ?? {}, source);
}

/** The defaults, with `overrides` on top (for tests and embedding). */
export function dispatcherConfig(overrides: Partial<DispatcherConfig> = {}): DispatcherConfig {
  return { ...compileDispatcherConfig({}), ...overrides };
}

/** Local slots actually used: the configured number, or the CPU count. */
export function effectiveLocalSlots(config: DispatcherConfig): number {
  return config.localSlots > 0 ? config.localSlots : availableParallelism();
}
