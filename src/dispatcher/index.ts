// The Postgres dispatcher: schema and migrations, queue queries, admission, the claim loop.
// It imports only src/shared and gen/: CapacitySource and ExecBackend are implemented by
// adapters in src/app over the broker client.
export {
  BlobStore,
  BlobWriter,
  checkBlobId,
  StoreLimitError,
  type BlobInfo,
  type BlobRole,
  type BlobWriteOptions,
  type StoreLimit,
  type WrittenBlob,
} from "./blob-store.js";
export { StoreRoom, type ReclaimedRoom, type StoreQuota, type VacuumReport } from "./blob-room.js";
export { CopyBinaryDecoder } from "./copy-binary.js";
export { inlineOutput, OutputSink, readOutput, type ItemOutput, type OutputSinkOptions } from "./output-sink.js";
export { compileStoreConfig, storeConfig, storeConfigSchema, type FreeSpaceFloor, type StoreConfig } from "./store-config.js";
export { capToDisk, diskBytesPerByte, floorBytes, nextAsk, openingAsk, VacuumPacer, type DiskSpace, type ReservationAsk } from "./store-quota.js";
export { execAdmission, instanceShare, reservedForHigh, type ExecAdmission, type InstanceShare } from "./admission.js";
export { ManualCapacitySource, type CapacitySource, type ExecInstance } from "./capacity.js";
export { compileDispatcherConfig, dispatcherConfig, dispatcherConfigSchema, effectiveLocalSlots, type DispatcherConfig } from "./config.js";
export {
  Dispatcher,
  DispatcherStopTimeoutError,
  type DispatcherOptions,
  type DispatcherState,
  type DispatcherStats,
  type ItemPosition,
} from "./dispatcher.js";
export { type ExecBackend, type ExecRequest, type ExecResult, type ExecRunOptions } from "./exec-backend.js";
export { describeFailure, runItem, type Outcome } from "./item-runner.js";
export { LiveItems, type LiveItem, type LiveListener, type LivePhase } from "./live.js";
export type { DispatcherEvents, RequeueReason, WakeSource } from "./events.js";
export {
  LocalActionRegistry,
  checksumAction,
  countAction,
  createDefaultActions,
  type LocalActionDefinition,
  type LocalActionFn,
} from "./local-actions.js";
export { LocalPermits, type Permit, type PermitCounts, type PermitState } from "./local-permits.js";
export { ensureDatabase, type DatabaseOutcome } from "./database.js";
export { loadMigrations, migrate, migrationsDir, type Migration, type MigrationReport } from "./migrate.js";
export { normalizeSubmit, type NormalizedSubmit } from "./payload.js";
export { fromPgError, isTransient, sqlState } from "./pg-errors.js";
export { itemStateFromProto, itemStateToProto, itemToProto, statsToProto, submitInputFromProto } from "./proto.js";
export { ItemControlStore, type CancelResult, type ItemPage } from "./item-control.js";
export { decodePageToken, defaultPageSize, encodePageToken, listQuery, maxPageSize, type ListFilter } from "./item-list.js";
export { itemRetryDelayMs, type DispatcherCounters } from "./settle.js";
export {
  QueueStore,
  type FylrRegistration,
  type FylrRow,
  type ItemSummary,
  type OpenItemCount,
  type ReapResult,
  type StoredPosition,
} from "./store.js";
export type { CallResult, ClaimedItem, ExecCallSpec, Fence, ItemKind, ItemState, LocalActionSpec, QueueItem, StdinSource, SubmitInput } from "./types.js";
export { Wakeup } from "./wakeup.js";
export { refusesWrites, WriteHealth, writeHealthMaxAgeMs } from "./write-health.js";
