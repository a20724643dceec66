/** What `slotbroker submit --wait` shows, pure: the progress line and the receipt lines. */
import { ErrorKind } from "../../gen/slotbroker/v1/broker_pb.js";
import { ItemState, type Item, type WatchResponse } from "../../gen/slotbroker/v1/queue_pb.js";
import { formatMs } from "../api/timeline.js";
import { durationMs } from "@bufbuild/protobuf/wkt";

const stateNames: Record<ItemState, string> = {
  [ItemState.UNSPECIFIED]: "unknown",
  [ItemState.QUEUED]: "queued",
  [ItemState.CLAIMED]: "claimed",
  [ItemState.RUNNING]: "running",
  [ItemState.SUCCEEDED]: "succeeded",
  [ItemState.FAILED]: "failed",
  [ItemState.CANCELLED]: "cancelled",
};

/** The lower-case name of a state. */
export function stateName(state: ItemState): string {
  return stateNames[state] ?? "unknown";
}

/** "queued (attempt 2 of 3): 2 running, 3 waiting - you are number 6, about 6s". */
export function progressLine(update: WatchResponse): string {
  const item = update.item;
  if (!item) return "?";
  const attempt = item.attempts > 1 ? ` (attempt ${item.attempts} of ${item.maxAttempts})` : "";
  const summary = update.position?.summary;
  const label = stateName(item.state);
  if (!summary || summary === label) return `${label}${attempt}`;
  // "running sha256sum on exec-1" says its state already.
  return summary.startsWith(label) ? `${summary}${attempt}` : `${label}${attempt}: ${summary}`;
}

/** One line per call that ran: "calls[0] sha256sum: exit 0 in 12ms on exec-1", plus why it failed. */
export function receiptLines(item: Item): string[] {
  return item.results.map((result, i) => {
    const r = result.receipt;
    if (!r) return `calls[${i}] ${result.service}: no receipt`;
    const how = r.error !== ErrorKind.UNSPECIFIED ? ErrorKind[r.error].toLowerCase() : r.signal ? `killed by ${r.signal}` : `exit ${r.exitCode ?? "?"}`;
    const ms = r.duration && durationMs(r.duration);
    const took = ms === undefined ? "" : ` in ${formatMs(ms)}`;
    const where = r.instanceId ? ` on ${r.instanceId}` : "";
    const detail = r.errorMessage || r.stderrLine;
    return `calls[${i}] ${result.service}: ${how}${took}${where}, ${r.stdoutBytes} bytes of stdout${detail ? ` - ${detail}` : ""}`;
  });
}
