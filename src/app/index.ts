// Process assembly: a fylr from its config (startFylr), the local stack of `slotbroker up`,
// GetStatus calls to execservers, and the fylr's metrics and status routes.
export { ExecserverLoad, ExecserverStatusClient, fetchExecserverStatus, serviceLoad, type StatusCallOptions } from "./execserver-status.js";
export { startFylr, type FylrHandle, type FylrState, type StartFylrOptions } from "./fylr.js";
export { compileFylrConfig, fylrConfigSchema, fylrEnvOverrides, loadFylrConfig, type FylrConfig, type FylrConfigInput } from "./fylr-config.js";
export { createFylrMetrics } from "./fylr-metrics.js";
export { metricsRoute, statusRoute, type FylrStatusJson } from "./fylr-routes.js";
export { demoExecserverConfig, onPath } from "./demo-services.js";
export { stackDataDir, startLocalStack, type LocalStack, type LocalStackOptions, type LocalStackPorts } from "./local-stack.js";
export { checkPortsFree, type PortClaim } from "./ports.js";
export { readUpState, removeUpState, resolveApi, upStateFile, writeUpState, type ApiTarget, type UpState } from "./up-state.js";
