/**
 * One item as QueueService shows it: the stored row plus its place in line, gathered from
 * the database, this fylr's live view and the execservers' load (see position.ts).
 */
import { Code, ConnectError } from "@connectrpc/connect";
import type { QueuePosition } from "../../gen/slotbroker/v1/queue_pb.js";
import type { Dispatcher, QueueItem } from "../dispatcher/index.js";
import { buildPosition, summaryWithoutTimes, type ExecLoadSource } from "./position.js";
import type { RuntimeMeans } from "./runtime-means.js";

/** What the item view reads from. */
export interface ItemViewDeps {
  readonly dispatcher: Dispatcher;
  readonly load?: ExecLoadSource;
  readonly means?: RuntimeMeans;
}

/** An item and where it stands; `position` is unset once it finished. */
export interface ItemSnapshot {
  readonly item: QueueItem;
  readonly position: QueuePosition;
}

/** True for SUCCEEDED, FAILED and CANCELLED: nothing about the item changes any more (unless retried). */
export function isFinished(item: QueueItem): boolean {
  return item.state === "succeeded" || item.state === "failed" || item.state === "cancelled";
}

/** The stored item; NOT_FOUND when there is none (INVALID_ARGUMENT for a malformed id comes from the queue store). */
export async function getItem(dispatcher: Dispatcher, id: string): Promise<QueueItem> {
  const item = await dispatcher.get(id);
  if (!item) throw new ConnectError(`item ${id} not found`, Code.NotFound);
  return item;
}

/** The item and its position, now. */
export async function snapshot(deps: ItemViewDeps, id: string): Promise<ItemSnapshot> {
  const item = await getItem(deps.dispatcher, id);
  const live = deps.dispatcher.liveItem(id);
  // Only a queued item has a count ahead of it in the database; skip the query otherwise.
  const aheadInQueue = item.state === "queued" ? ((await deps.dispatcher.position(id))?.aheadInQueue ?? 0) : 0;
  const service = live?.service ?? (item.kind === "exec" ? item.calls[0]?.service : item.local?.name);
  const parked = live?.phase === "waiting" && live.position !== undefined;
  const needsLoad = item.kind === "exec" && !isFinished(item) && !parked && service !== undefined;
  const load = needsLoad ? await deps.load?.load(service) : undefined;
  const stats = item.kind === "local" ? deps.dispatcher.stats() : undefined;
  const position = buildPosition({
    state: item.state,
    kind: item.kind,
    service,
    startAfter: item.startAfter,
    aheadInQueue,
    claimedBy: item.claimedBy,
    error: item.error,
    live,
    load,
    local: stats && { running: stats.localRunning, capacity: stats.localCapacity },
    meanRuntimeMs: service === undefined ? undefined : deps.means?.meanMs(service),
    now: new Date(),
  });
  return { item, position };
}

/**
 * What makes a Watch update worth sending: state, attempt, owner, the line's numbers and
 * its summary. Not the ETA or countdowns, which drift with the clock.
 */
export function changeKey(s: ItemSnapshot): string {
  const p = s.position;
  return JSON.stringify([
    s.item.state,
    s.item.attempts,
    s.item.claimedBy ?? "",
    s.item.cancelRequestedAt?.getTime() ?? 0,
    p.running,
    p.capacity,
    p.aheadInQueue,
    p.aheadAtExecserver,
    summaryWithoutTimes(p.summary),
  ]);
}
