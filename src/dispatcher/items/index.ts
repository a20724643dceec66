// Running what was claimed: one task per held item (item-tasks.ts), its run on an
// execserver through the ExecBackend or as a local action (item-runner.ts), the fenced
// write of its outcome (settle.ts), and this fylr's live view of the items it holds.
export { type ExecBackend, type ExecRequest, type ExecResult, type ExecRunOptions } from "./exec-backend.js";
export { describeFailure, runItem, type Outcome } from "./item-runner.js";
export { LiveItems, type LiveItem, type LiveListener, type LivePhase } from "./live.js";
export {
  LocalActionRegistry,
  checksumAction,
  countAction,
  createDefaultActions,
  type LocalActionDefinition,
  type LocalActionFn,
} from "./local-actions.js";
export { itemRetryDelayMs, type DispatcherCounters } from "./settle.js";
