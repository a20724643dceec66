// The exec host's entry: it imports the execserver's assembly alone, never src/app/index.ts
// (which loads the dispatcher and pg).
import type { ExecserverHandle } from "../app/execserver.js";
import { loadExecserverConfig } from "../execserver/config.js";
import { ConfigError, SlotbrokerError } from "../shared/errors.js";
import { createLogger } from "../shared/log.js";
import { startTracing } from "../shared/tracing/index.js";
import { parseConfigFlag, untilSignalled } from "./serve.js";

const help = `usage: slotbroker execserver --config FILE

Runs an execserver: serves slotbroker.v1.BrokerService (plus gRPC health and reflection)
on "listen" and /healthz, /readyz, /livez, /metrics, /status.json on "adminListen". With "legacy.enabled"
it also serves the pre-broker token protocol (GET /token, PUT /job); with
"brokerService: false" (legacy-only) "listen" serves only that, over plain HTTP.

options:
  -c, --config FILE   YAML config (see examples/execserver.yaml)
  -h, --help          this text

environment overrides: SLOTBROKER_TOKEN, SLOTBROKER_LISTEN, SLOTBROKER_ADMIN_LISTEN,
SLOTBROKER_INSTANCE_ID. Logs are JSON lines on stderr; SLOTBROKER_LOG_LEVEL (default info:
connections, refusals, rejected frames, expired offers, failed jobs; debug adds every job)
sets the level. The standard OTEL_* variables turn traces on (docs/operator-guide.md).

On start it prints one plain line on stdout:
  execserver <instanceId> listening grpc=HOST:PORT admin=HOST:PORT [legacy=HOST:PORT]
(legacy-only: "execserver <instanceId> listening legacy=HOST:PORT admin=HOST:PORT").
SIGTERM or SIGINT drains (no new grants, running jobs get drainTimeout to finish);
a second signal stops at once.`;

/** `slotbroker execserver --config FILE`: runs until SIGTERM/SIGINT; resolves with the exit code. */
export async function run(argv: string[]): Promise<number> {
  const configPath = parseConfigFlag("execserver", argv, help);
  if (typeof configPath === "number") return configPath;
  const logger = createLogger();
  let handle: ExecserverHandle;
  let stopTracing: (() => Promise<void>) | undefined;
  try {
    const config = loadExecserverConfig(configPath);
    stopTracing = await startTracing("slotbroker-execserver", { logger });
    // Loaded once the config is good: a bad one is named in a fraction of a second.
    const { startExecserver } = await import("../app/execserver.js");
    handle = await startExecserver(config, { logger });
  } catch (err) {
    await stopTracing?.();
    const e = SlotbrokerError.from(err);
    process.stderr.write(`slotbroker execserver: ${e instanceof ConfigError ? "invalid config: " : ""}${e.message}\n`);
    logger.flush();
    return 1;
  }
  const grpc = handle.grpcAddress;
  const admin = handle.adminUrl.replace(/^http:\/\//, "");
  const legacy = handle.legacyUrl?.replace(/^http:\/\//, "");
  logger.info({ instanceId: handle.instanceId, grpc, admin, legacy }, "execserver listening");
  const where = grpc ? `grpc=${grpc} admin=${admin}${legacy ? ` legacy=${legacy}` : ""}` : `legacy=${legacy} admin=${admin}`;
  process.stdout.write(`execserver ${handle.instanceId} listening ${where}\n`);
  const code = await untilSignalled(handle, logger, "draining");
  await stopTracing?.();
  logger.info("execserver stopped");
  logger.flush();
  return code;
}
