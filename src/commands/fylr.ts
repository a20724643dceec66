import { loadFylrConfig } from "../app/fylr-config.js";
import type { FylrHandle } from "../app/fylr.js";
import { ConfigError, SlotbrokerError } from "../shared/errors.js";
import { createLogger } from "../shared/log.js";
import { startTracing } from "../shared/tracing/index.js";
import { parseConfigFlag, untilSignalled } from "./serve.js";

const help = `usage: slotbroker fylr --config FILE

Runs a fylr: connects to the execservers, claims its share of the queue in Postgres and
runs the items; serves QueueService (Connect, gRPC, JSON over HTTP/1.1), the one-time
pipes, /healthz, /readyz, /livez, /metrics and /status.json on "listen".

options:
  -c, --config FILE   YAML config (see examples/fylr.yaml)
  -h, --help          this text

environment: DATABASE_URL (when the config has no databaseUrl); overrides SLOTBROKER_TOKEN
(execserver.token), SLOTBROKER_LISTEN, SLOTBROKER_FYLR_NAME, SLOTBROKER_API_TOKENS_FILE
(auth.tokensFile), SLOTBROKER_API_TOKENS (auth.tokens, as JSON); SLOTBROKER_LOG_LEVEL sets
the log level; the standard OTEL_* variables turn traces on (docs/operator-guide.md).

A "listen" that is not a loopback address needs API credentials (auth.tokens,
auth.tokensFile or auth.clients); the fylr refuses to start without.

On start it prints one plain line on stdout:
  fylr <id> listening http=HOST:PORT
SIGTERM or SIGINT stops claiming and lets running items finish (dispatcher.stopGrace,
then they go back to the queue); a second signal gives them back at once. SIGHUP reads
auth.tokensFile again at once (it is also re-read every auth.reloadInterval).`;

/** `slotbroker fylr --config FILE`: runs until SIGTERM/SIGINT; resolves with the exit code. */
export async function run(argv: string[]): Promise<number> {
  const configPath = parseConfigFlag("fylr", argv, help);
  if (typeof configPath === "number") return configPath;
  const logger = createLogger();
  let handle: FylrHandle;
  let stopTracing: (() => Promise<void>) | undefined;
  try {
    const config = loadFylrConfig(configPath);
    stopTracing = await startTracing("slotbroker-fylr", { logger });
    // Loaded once the config is good: a bad one is named in a fraction of a second.
    const { startFylr } = await import("../app/fylr.js");
    handle = await startFylr(config, { logger });
  } catch (err) {
    await stopTracing?.();
    const e = SlotbrokerError.from(err);
    process.stderr.write(`slotbroker fylr: ${e instanceof ConfigError ? "invalid config: " : ""}${e.message}\n`);
    logger.flush();
    return 1;
  }
  logger.info({ fylrId: handle.id, http: handle.address }, "fylr listening");
  process.stdout.write(`fylr ${handle.id} listening http=${handle.address}\n`);
  // Rotation: the new tokens file is in force as soon as it has been read.
  const onHangup = (): void => {
    handle.reloadAuth().then(
      (outcome) => logger.info({ outcome: outcome?.outcome ?? "no auth.tokensFile" }, "SIGHUP: api tokens reload"),
      (err: unknown) => logger.error({ err }, "SIGHUP: api tokens reload failed"),
    );
  };
  process.on("SIGHUP", onHangup);
  const code = await untilSignalled(handle, logger, "stopping (items get dispatcher.stopGrace to finish)");
  process.off("SIGHUP", onHangup);
  await stopTracing?.();
  logger.info("fylr stopped");
  logger.flush();
  return code;
}
