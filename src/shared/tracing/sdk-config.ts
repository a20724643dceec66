/**
 * Whether the standard OpenTelemetry variables ask for traces, and how to export them.
 * Pure: read from the environment given, never from the SDK (which is loaded only when
 * this says so).
 */
import { ConfigError } from "../errors.js";

/** Where finished spans go. */
export type TraceExporterName = "otlp" | "console";

/** What the environment asks for; undefined from tracingFromEnv: tracing stays off. */
export interface TracingSettings {
  readonly exporters: readonly TraceExporterName[];
}

const exporterNames = new Set(["otlp", "console", "none"]);

/**
 * Traces are on when OTEL_TRACES_EXPORTER names an exporter (otlp, console), or when it is
 * unset and OTEL_EXPORTER_OTLP_ENDPOINT or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT is set; off
 * with OTEL_SDK_DISABLED=true or OTEL_TRACES_EXPORTER=none. A value the exporter here
 * cannot honour is a ConfigError naming the variable.
 */
export function tracingFromEnv(env: NodeJS.ProcessEnv): TracingSettings | undefined {
  if (env.OTEL_SDK_DISABLED?.trim().toLowerCase() === "true") return undefined;
  const named = (env.OTEL_TRACES_EXPORTER ?? "")
    .split(",")
    .map((s) => s.trim().toLowerCase())
    .filter((s) => s !== "");
  for (const name of named) {
    if (!exporterNames.has(name)) throw new ConfigError(`OTEL_TRACES_EXPORTER: unknown exporter "${name.slice(0, 40)}" (known: otlp, console, none)`);
  }
  const endpoint = env.OTEL_EXPORTER_OTLP_TRACES_ENDPOINT || env.OTEL_EXPORTER_OTLP_ENDPOINT;
  const exporters = (named.length === 0 && endpoint ? ["otlp"] : named).filter((s): s is TraceExporterName => s !== "none");
  if (exporters.length === 0 || named.includes("none")) return undefined;
  if (exporters.includes("otlp")) {
    for (const key of ["OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"] as const) {
      const protocol = env[key]?.trim();
      if (protocol && protocol !== "http/protobuf") throw new ConfigError(`${key}: "${protocol.slice(0, 40)}" is not supported (use http/protobuf)`);
      if (protocol) break;
    }
  }
  return { exporters };
}
