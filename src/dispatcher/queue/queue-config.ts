/**
 * Settings of the queue table itself: the `queue:` section of the fylr config, validated
 * once into a fully defaulted object. Finished item rows (succeeded, failed, cancelled) are
 * deleted `retention` after they finished, so a queue that runs for a year keeps a table
 * the size of its last `retention` of work, not of its whole history.
 */
import { z } from "zod";
import { durationMs, parseConfig } from "../../shared/config-parsing.js";
import { parseDuration } from "../../shared/duration.js";

/** The compiled queue configuration. */
export interface QueueConfig {
  /** A finished item row is deleted this long after it finished; undefined: kept forever ("off"). Default 7 days. */
  readonly retentionMs: number | undefined;
  /** How often a fylr deletes finished rows past the retention (default 1 min). */
  readonly sweepIntervalMs: number;
}

/** Rows one sweep statement deletes at most: a short transaction, however far behind the sweep is. */
export const finishedSweepBatch = 1000;

/** A duration, or "off". */
const retention = z.string().transform((text, ctx): number | "off" => {
  if (text.trim() === "off") return "off";
  const ms = parseDuration(text);
  if (ms !== undefined) return ms;
  ctx.addIssue({ code: "custom", message: `expected a duration with a unit such as "7d" or "12h", or "off", got "${text}"` });
  return z.NEVER;
});

/** The YAML shape of the `queue:` section; every key optional. */
export const queueConfigSchema = z
  .strictObject({
    retention: retention.prefault("7d"),
    sweepInterval: durationMs.prefault("1m"),
  })
  .superRefine((c, ctx) => {
    if (c.retention !== "off" && c.retention <= 0) {
      ctx.addIssue({ code: "custom", path: ["retention"], message: `must be longer than 0, or "off" to keep finished items forever` });
    }
    if (c.sweepInterval <= 0) ctx.addIssue({ code: "custom", path: ["sweepInterval"], message: "must be longer than 0" });
  })
  .transform(
    (c): QueueConfig => ({
      retentionMs: c.retention === "off" ? undefined : c.retention,
      sweepIntervalMs: c.sweepInterval,
    }),
  );

/** Validates a raw `queue:` section; a ConfigError names the bad key. */
export function compileQueueConfig(raw: unknown = {}, source = "queue"): QueueConfig {
  return parseConfig(queueConfigSchema, raw ?? {}, source);
}

/** The defaults, with `overrides` on top (for tests and embedding). */
export function queueConfig(overrides: Partial<QueueConfig> = {}): QueueConfig {
  return { ...compileQueueConfig({}), ...overrides };
}
