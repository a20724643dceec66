// The Postgres dispatcher: the queue in Postgres (./queue), claiming (./claims), running
// what was claimed (./items) and the store of inputs and outputs (./blobs), joined by the
// Dispatcher of one fylr. It imports only src/shared and gen/: CapacitySource and
// ExecBackend are implemented by adapters in src/app over the broker client. Each part's
// index.ts says what it offers; inside the dispatcher, modules import each other directly.
export { compileDispatcherConfig, dispatcherConfig, dispatcherConfigSchema, effectiveLocalSlots, type DispatcherConfig } from "./config.js";
export {
  Dispatcher,
  DispatcherStopTimeoutError,
  type DispatcherOptions,
  type DispatcherState,
  type DispatcherStats,
  type ItemPosition,
} from "./dispatcher.js";
export type { DispatcherEvents, RequeueReason, WakeSource } from "./events.js";
export { historyToProto, itemStateFromProto, itemStateToProto, itemToBinary, itemToProto, statsToProto, submitInputFromProto, submitRequestFromBinary } from "./proto.js";
export type { CallResult, ClaimedItem, ItemEvent, ItemEventKind, ItemHistory, ExecCallSpec, Fence, ItemKind, ItemState, LocalActionSpec, QueueItem, StdinSource, SubmitInput } from "./types.js";
export * from "./blobs/index.js";
export * from "./claims/index.js";
export * from "./items/index.js";
export * from "./queue/index.js";
