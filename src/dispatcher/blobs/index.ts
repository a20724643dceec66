// The store: inputs and outputs of any size in the queue's own Postgres (the `store:`
// section), streamed in chunk rows and read back with binary COPY, with room reserved
// against its limits before a byte is written. In this code "store" alone means this
// store; the queue's tables are the queue store (../queue).
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
export { CopyBinaryDecoder } from "./copy-binary.js";
export { inlineOutput, OutputSink, readOutput, type ItemOutput, type OutputSinkOptions } from "./output-sink.js";
export { compileStoreConfig, storeConfig, storeConfigSchema, type FreeSpaceFloor, type StoreConfig } from "./store-config.js";
export { capToDisk, diskBytesPerByte, floorBytes, nextAsk, openingAsk, VacuumPacer, type DiskSpace, type ReservationAsk } from "./store-quota.js";
export { StoreRoom, type ReclaimedRoom, type StoreQuota, type VacuumReport } from "./store-room.js";
