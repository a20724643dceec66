/**
 * Starts traces for `slotbroker fylr` and `slotbroker execserver` when the OTEL_*
 * variables ask for them (see sdk-config.ts); otherwise loads nothing.
 */
import type { Logger } from "../log.js";
import { tracingFromEnv } from "./sdk-config.js";
import { tracing } from "./trace-context.js";

/**
 * Loads and registers the SDK when the environment asks for traces; resolves with its
 * shutdown (which flushes buffered spans), or undefined when traces are off. Throws a
 * ConfigError for a variable it cannot honour, and an Error naming the package when the
 * optional SDK packages are not installed.
 */
export async function startTracing(
  serviceName: string,
  options: { env?: NodeJS.ProcessEnv; attributes?: Record<string, string>; logger?: Logger } = {},
): Promise<(() => Promise<void>) | undefined> {
  const settings = tracingFromEnv(options.env ?? process.env);
  if (!settings) return undefined;
  const sdk = await import("./sdk-start.js").catch((err: unknown) => {
    throw new Error(
      `traces were asked for (OTEL_*) but the OpenTelemetry SDK could not be loaded: ${(err as Error).message}; install the optional dependencies (npm install --include=optional)`,
    );
  });
  const shutdown = sdk.startSdk(settings, serviceName, options.attributes ?? {});
  tracing.on = true;
  options.logger?.info({ exporters: settings.exporters }, "traces on");
  return async () => {
    tracing.on = false;
    await shutdown().catch((err: unknown) => options.logger?.warn({ err }, "flushing traces failed"));
  };
}
