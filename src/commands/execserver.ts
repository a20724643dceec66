import { parseArgs } from "node:util";
import { loadExecserverConfig, startExecserver } from "../execserver/index.js";
import { ConfigError, SlotbrokerError } from "../shared/errors.js";
import { createLogger } from "../shared/log.js";

const help = `usage: slotbroker execserver --config FILE

Runs an execserver: serves slotbroker.v1.BrokerService (plus gRPC health and reflection)
on "listen" and /healthz, /metrics, /status.json on "adminListen".

options:
  -c, --config FILE   YAML config (see examples/execserver.yaml)
  -h, --help          this text

environment overrides: SLOTBROKER_TOKEN, SLOTBROKER_LISTEN, SLOTBROKER_ADMIN_LISTEN,
SLOTBROKER_INSTANCE_ID; SLOTBROKER_LOG_LEVEL sets the log level.

On start it prints one plain line on stdout:
  execserver <instanceId> listening grpc=HOST:PORT admin=HOST:PORT
SIGTERM or SIGINT drains (no new grants, running jobs get drainTimeout to finish);
a second signal stops at once.`;

/** `slotbroker execserver --config FILE`: runs until SIGTERM/SIGINT; resolves with the exit code. */
export async function run(argv: string[]): Promise<number> {
  let configPath: string | undefined;
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
    configPath = values.config;
  } catch (err) {
    process.stderr.write(`slotbroker execserver: ${(err as Error).message}\n\n${help}\n`);
    return 2;
  }
  if (!configPath) {
    process.stderr.write(`slotbroker execserver: --config FILE is required\n\n${help}\n`);
    return 2;
  }

  const logger = createLogger();
  let handle;
  try {
    const config = loadExecserverConfig(configPath);
    handle = await startExecserver(config, { logger });
  } catch (err) {
    const e = SlotbrokerError.from(err);
    process.stderr.write(`slotbroker execserver: ${e instanceof ConfigError ? "invalid config: " : ""}${e.message}\n`);
    logger.flush();
    return 1;
  }
  const grpc = handle.grpcAddress;
  const admin = handle.adminUrl.replace(/^http:\/\//, "");
  logger.info({ instanceId: handle.instanceId, grpc, admin }, "execserver listening");
  process.stdout.write(`execserver ${handle.instanceId} listening grpc=${grpc} admin=${admin}\n`);

  const server = handle;
  await new Promise<void>((resolve) => {
    let signals = 0;
    const onSignal = (signal: NodeJS.Signals): void => {
      signals++;
      logger.info({ signal }, signals === 1 ? "draining" : "stopping now");
      const done = signals === 1 ? server.close() : server.forceClose();
      done.then(resolve, (err: unknown) => {
        logger.error({ err }, "shutdown failed");
        resolve();
      });
    };
    process.on("SIGTERM", onSignal);
    process.on("SIGINT", onSignal);
  });
  logger.info("execserver stopped");
  logger.flush();
  return 0;
}
