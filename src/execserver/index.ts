// The execserver: the want-book, slot ledgers and broker core (pure), the sessions and
// gRPC/admin servers around them, its config, and the process runner (./runner). Imports
// only src/shared and gen/ (never database code); startExecserver in src/app assembles it.

export { AdminServer, type AdminHandler } from "./admin-server.js";
export type { RunJob } from "./runner/index.js";
export { BrokerCore, ClientConnection, JobRecord, Waitgroup, type CoreEffects, type JobState, type OfferOutcome } from "./broker-core.js";
export {
  builtinServices,
  compileExecserverConfig,
  execserverConfigSchema,
  execserverEnvOverrides,
  generateInstanceId,
  loadExecserverConfig,
  type BuiltinService,
  type ExecserverConfig,
  type ExecserverConfigInput,
  type ServiceConfig,
} from "./config.js";
export { limits } from "./limits.js";
export { Execserver, healthServices, type ExecserverOptions } from "./server.js";
export type { ExecserverEvents, ExecserverState } from "./events.js";
export { RollingMean, SlotLedger, TokenSource } from "./slot-ledger.js";
export { WantBook, ParkedWant, type PriorityDepthEntry } from "./want-book.js";
