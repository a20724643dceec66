// The queue in Postgres: the schema (./migrations, applied by migrate.ts), every runtime
// statement (sql.ts), typed calls over them (QueueStore; cancel, list, retry and delete in
// ItemControlStore), writes grouped into fewer statements (group-commit.ts), the stored
// shape of an item and the validation of a submit (payload.ts), and Postgres errors
// translated once (pg-errors.ts). The rest of the dispatcher builds on it.
export { ensureDatabase, type DatabaseOutcome } from "./database.js";
export { ItemControlStore, type CancelResult, type ItemPage } from "./item-control.js";
export { decodePageToken, defaultPageSize, encodePageToken, listQuery, maxPageSize, type ListFilter } from "./item-list.js";
export { loadMigrations, migrate, migrationsDir, type Migration, type MigrationReport } from "./migrate.js";
export { normalizeSubmit, type NormalizedSubmit } from "./payload.js";
export { compileQueueConfig, finishedSweepBatch, queueConfig, queueConfigSchema, type QueueConfig } from "./queue-config.js";
export { fromPgError, isTransient, sqlState } from "./pg-errors.js";
export {
  QueueStore,
  type FylrRegistration,
  type FylrRow,
  type ItemSummary,
  type KeyCount,
  type OpenItemCount,
  type ReapResult,
  type StoredPosition,
  type SweptItems,
} from "./queue-store.js";
