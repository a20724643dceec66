import { parseArgs } from "node:util";
import type { Logger } from "../shared/log.js";

// Read when the command loads, before the server announces itself: the wrapper may die the
// moment the "listening" line is out, before the watch begins.
const launchedBy = process.ppid;

/**
 * Parses `--config FILE` / `--help` for a server command. Returns the config path, or the
 * exit code when the command should stop here (0 after --help, 2 on bad usage).
 */
export function parseConfigFlag(command: string, argv: string[], help: string): string | number {
  let config: string | undefined;
  try {
    const { values } = parseArgs({
      args: argv,
      options: { config: { type: "string", short: "c" }, help: { type: "boolean", short: "h" } },
      strict: true,
    });
    if (values.help) {
      process.stdout.write(`${help}\n`);
      return 0;
    }
    config = values.config;
  } catch (err) {
    process.stderr.write(`slotbroker ${command}: ${(err as Error).message}\n\n${help}\n`);
    return 2;
  }
  if (!config) {
    process.stderr.write(`slotbroker ${command}: --config FILE is required\n\n${help}\n`);
    return 2;
  }
  return config;
}

/** A running server that stops gracefully with close() and at once with forceClose(). */
export interface Stoppable {
  close(): Promise<void>;
  forceClose(): Promise<void>;
}

/**
 * Waits for SIGTERM/SIGINT: the first stops the server gracefully, a second at once.
 * Resolves with the exit code: 0, or 1 when stopping failed.
 */
export function untilSignalled(server: Stoppable, logger: Logger, gracefulMessage: string): Promise<number> {
  return new Promise((resolve) => {
    let signals = 0;
    const onSignal = (signal: NodeJS.Signals): void => {
      signals++;
      logger.info({ signal }, signals === 1 ? gracefulMessage : "stopping now");
      const done = signals === 1 ? server.close() : server.forceClose();
      done.then(
        () => resolve(0),
        (err: unknown) => {
          logger.error({ err }, "shutdown failed");
          resolve(1);
        },
      );
    };
    process.on("SIGTERM", onSignal);
    process.on("SIGINT", onSignal);
    // Counts as a first signal only: with Ctrl-C, npm's shell dies right after the SIGINT.
    onWrapperGone(() => {
      if (signals === 0) onSignal("SIGTERM");
    });
  });
}

/**
 * Calls `callback` once when npm started this process (npx, npm start, npm run) and the
 * process that started it goes away. npm passes SIGTERM to its child, `sh -c`, which dies
 * without passing it on, so the server would run on re-parented to init. Elsewhere nothing
 * is watched: a server started with `nohup … &` must outlive its shell. Returns a stop function.
 */
export function onWrapperGone(callback: () => void, env: NodeJS.ProcessEnv = process.env): () => void {
  if (!env.npm_command) return () => undefined;
  // No event tells a process its parent died; one cheap syscall every half second does.
  const timer = setInterval(() => {
    if (process.ppid === launchedBy) return;
    clearInterval(timer);
    callback();
  }, 500);
  timer.unref();
  return () => clearInterval(timer);
}

