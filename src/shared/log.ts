import { pino, type Bindings, type LevelWithSilent, type LogFn, type Logger } from "pino";
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

const lineLevels = ["fatal", "error", "warn", "info", "debug", "trace"] as const satisfies readonly LevelWithSilent[];

/**
 * `parent.child(bindings)`, made only when a line at a level `parent` lets through is
 * logged (or a child of it is asked for). For a logger per item or per job, whose lines
 * are rare: building a pino child costs more than the closures that stand in for it.
 */
export function lazyChild(parent: Logger, bindings: Bindings): Logger {
  let child: Logger | undefined;
  const made = (): Logger => (child ??= parent.child(bindings));
  const lazy = Object.create(parent) as Logger;
  for (const level of lineLevels) {
    const line: LogFn = (...args: Parameters<LogFn>) => {
      if (parent.isLevelEnabled(level)) made()[level](...args);
    };
    lazy[level] = line;
  }
  lazy.child = (more, options) => made().child(more, options);
  return lazy;
}

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
