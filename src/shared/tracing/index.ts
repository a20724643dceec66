export * from "./trace-context.js";
export { startTracing } from "./start.js";
export { tracingFromEnv, type TracingSettings } from "./sdk-config.js";
