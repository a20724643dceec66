import { pino, type Logger } from "pino";

export type { Logger };

/**
 * The root logger. JSON lines on stderr, so stdout stays free for command output.
 * Level from SLOTBROKER_LOG_LEVEL (default "info"; tests usually set "silent").
 * Components take `logger.child({ component, ... })`.
 */
export function createLogger(options: { name?: string; level?: string } = {}): Logger {
  return pino(
    {
      name: options.name ?? "slotbroker",
      level: options.level ?? process.env.SLOTBROKER_LOG_LEVEL ?? "info",
      base: { pid: process.pid },
      redact: { paths: ["token", "*.token", "authorization", "*.authorization"], censor: "[redacted]" },
    },
    pino.destination({ dest: 2, sync: false }),
  );
}

/** A logger that drops everything; the default for library use and tests. */
export const silentLogger: Logger = pino({ level: "silent" });
