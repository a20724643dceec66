// The queue API: QueueService (Submit, Get, Watch, Position, Stats) over Connect, the
// position of an item merged from the database, this fylr and the execservers, ETA hints.
export { changeKey, getItem, isFinished, snapshot, type ItemSnapshot, type ItemViewDeps } from "./item-view.js";
export { buildPosition, estimateMs, summaryWithoutTimes, type ExecLoadSource, type PositionFacts, type ServiceLoad } from "./position.js";
export { queueServiceImpl, registerQueueService, type QueueApiOptions } from "./queue-service.js";
export { measuredBackend, RuntimeMeans } from "./runtime-means.js";
export { describeEvent, formatMs, formatSince, formatStep, timelineRows, timelineText, type TimelineRow } from "./timeline.js";
export { watchItem, type WatchOptions } from "./watch.js";
export {
  authorizationHeaders,
  createQueueClient,
  followItem,
  itemFinished,
  tlsOptions,
  type ApiCredentials,
  type FollowOptions,
  type QueueClient,
} from "./client.js";
export { downloadOutput, uploadInput, type StoredUpload } from "./store-client.js";
