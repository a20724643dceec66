/**
 * Awaiting an item's state through QueueService.Watch: the fylr pushes every change (its
 * own, or another fylr's by NOTIFY), so a test in another process waits on the item's own
 * lifecycle instead of polling Get.
 */
import { ItemState, type WatchResponse } from "../../gen/slotbroker/v1/queue_pb.js";
import type { QueueClient } from "../../src/api/index.js";

/** Follows the item's Watch stream until an update passes `until`; fails naming `what` with what it saw. */
export async function watchUntil(client: QueueClient, id: string, what: string, until: (update: WatchResponse) => boolean, timeoutMs = 30_000): Promise<WatchResponse> {
  const seen: string[] = [];
  try {
    for await (const update of client.watch({ id }, { timeoutMs })) {
      if (until(update)) return update;
      seen.push(`${ItemState[update.item?.state ?? 0]} ${update.position?.summary ?? ""}`.trim());
    }
  } catch (err) {
    throw new Error(`waiting for ${what}: ${(err as Error).message}; saw ${seen.join(" | ") || "nothing"}`);
  }
  throw new Error(`waiting for ${what}: the Watch ended; saw ${seen.join(" | ") || "nothing"}`);
}

/** An update whose item is in one of `states`. */
export function inState(...states: ItemState[]): (update: WatchResponse) => boolean {
  return (update) => update.item !== undefined && states.includes(update.item.state);
}
