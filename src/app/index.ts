// Process assembly: where the engines (execserver, fylr, dispatcher) and the queue API are
// joined. A fylr from its config (startFylr), an execserver with its admin routes
// (startExecserver), the local stack of `slotbroker up`, GetStatus calls to execservers,
// the fylr's metrics and status routes. An exec host imports ./execserver.js alone: this
// index loads the dispatcher and pg.
export { ExecserverLoad, ExecserverStatusClient, fetchExecserverStatus, serviceLoad, type StatusCallOptions } from "./execserver-status.js";
export { brokerCapacity, execBackend } from "./exec-adapters.js";
export { startExecserver, type ExecserverHandle, type StartExecserverOptions } from "./execserver.js";
export { createFylrStatusPage, type FylrStatusPage, type FylrStatusPageOptions } from "./fylr-status-page.js";
export { FylrStatusSource, type FylrStatusSourceOptions } from "./fylr-status-source.js";
export { startFylr, type FylrHandle, type FylrState, type StartFylrOptions } from "./fylr.js";
export { compileFylrConfig, fylrConfigSchema, fylrEnvOverrides, loadFylrConfig, type FylrConfig, type FylrConfigInput } from "./fylr-config.js";
export { createFylrMetrics } from "./fylr-metrics.js";
export { metricsRoute, statusRoute, type FylrStatusJson } from "./fylr-routes.js";
export { ifRangeHolds, INPUTS_PATH, parseRange, storeRoutes, type UploadAnswer } from "./store-routes.js";
export { demoExecserverConfig, onPath } from "./demo-services.js";
export { checkPortsFree, stackDataDir, startLocalStack, type LocalStack, type LocalStackOptions, type LocalStackPorts, type PortClaim } from "./local-stack.js";
export { readUpState, removeUpState, resolveApi, upStateFile, writeUpState, type ApiTarget, type UpState } from "./up-state.js";
