import { pino, type Logger } from "pino";
import { activeTraceIds, tracing } from "./tracing/trace-context.js";

export type { Logger };

/**
 * The root logger. JSON lines on stderr, so stdout stays free for command output.
 * Level from SLOTBROKER_LOG_LEVEL (default "info"; tests usually set "silent").
 * Components take `logger.child({ component, ... })`. With traces on, a line logged while a
 * span is active carries its trace_id and span_id.
 */
export function createLogger(options: { name?: string; level?: string } = {}): Logger {
  return pino(
    {
      name: options.name ?? "slotbroker",
      level: options.level ?? process.env.SLOTBROKER_LOG_LEVEL ?? "info",
      base: { pid: process.pid },
      mixin: () => (tracing.on && activeTraceIds()) || noFields,
      redact: { paths: ["token", "*.token", "authorization", "*.authorization"], censor: "[redacted]" },
    },
    pino.destination({ dest: 2, sync: false }),
  );
}

const noFields = {};

/** A logger that drops everything; the default for library use and tests. */
export const silentLogger: Logger = pino({ level: "silent" });

/**
 * At most `burst` lines per `intervalMs` for one kind of event; the rest are counted, so a
 * hostile or broken peer cannot flood the log. The next line that passes carries the count.
 */
export class LogBudget {
  private windowStart = -Infinity;
  private used = 0;
  private dropped = 0;

  constructor(
    private readonly burst = 10,
    private readonly intervalMs = 10_000,
    private readonly now: () => number = () => performance.now(),
  ) {}

  /** undefined when this line should be left out; else how many were left out before it. */
  take(): number | undefined {
    const t = this.now();
    if (t - this.windowStart >= this.intervalMs) {
      this.windowStart = t;
      this.used = 0;
    }
    if (this.used >= this.burst) {
      this.dropped++;
      return undefined;
    }
    this.used++;
    const dropped = this.dropped;
    this.dropped = 0;
    return dropped;
  }
}
