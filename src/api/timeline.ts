/**
 * An item's timeline as people read it, pure: one row per HistoryResponse event with the
 * time since the step before and a sentence saying what happened. `slotbroker show` prints
 * the rows as text, the fylr's status page as a table.
 */
import { durationMs, timestampDate } from "@bufbuild/protobuf/wkt";
import { ErrorKind } from "../../gen/slotbroker/v1/broker_pb.js";
import { ItemEventKind, type HistoryResponse, type ItemEvent } from "../../gen/slotbroker/v1/queue_pb.js";

/** One step of the timeline. */
export interface TimelineRow {
  readonly number: number;
  readonly at: Date | undefined;
  /** Since the step before; undefined for the first. */
  readonly sincePreviousMs: number | undefined;
  readonly what: string;
}

/** The rows of a history, oldest first. */
export function timelineRows(history: HistoryResponse): TimelineRow[] {
  let previous: Date | undefined;
  return history.events.map((e) => {
    const at = e.at && timestampDate(e.at);
    const sincePreviousMs = at && previous ? at.getTime() - previous.getTime() : undefined;
    previous = at ?? previous;
    return { number: e.number, at, sincePreviousMs, what: describeEvent(e) };
  });
}

/** "12ms", "1.25s", "8m 3s": a step's length, with the precision a timeline needs. */
export function formatStep(ms: number): string {
  if (Math.abs(ms) < 1000) return `${Math.round(ms)}ms`;
  if (Math.abs(ms) < 60_000) return `${(ms / 1000).toFixed(2)}s`;
  return formatMs(ms);
}

/** "+12ms", or "-3ms" when the step went back (a call's times are its fylr's clock, the rest the database's); "" for none. */
export function formatSince(ms: number | undefined): string {
  if (ms === undefined) return "";
  return ms >= 0 ? `+${formatStep(ms)}` : `-${formatStep(-ms)}`;
}

/** What one event says, e.g. "call sha256sum started on exec-1 after 3ms waiting for a slot". */
export function describeEvent(e: ItemEvent): string {
  const attempt = e.attempt > 0 ? ` (attempt ${e.attempt})` : "";
  const by = e.fylr ? ` by ${e.fylr}` : "";
  const detail = e.detail ? `: ${e.detail}` : "";
  switch (e.kind) {
    case ItemEventKind.SUBMITTED:
      return "submitted";
    case ItemEventKind.CLAIMED:
      return `claimed${by}${attempt}`;
    case ItemEventKind.RUNNING:
      return `running${e.fylr ? ` on ${e.fylr}` : ""}${attempt}`;
    case ItemEventKind.CALL_STARTED: {
      const wait = e.slotWait ? ` after ${formatStep(durationMs(e.slotWait))} waiting for a slot` : "";
      return `call ${e.service} started on ${e.execserver || "?"}${wait}${attempt}`;
    }
    case ItemEventKind.CALL_ENDED: {
      const how =
        e.errorKind !== ErrorKind.UNSPECIFIED
          ? (ErrorKind[e.errorKind] ?? "failed").toLowerCase().replace(/_/g, " ")
          : e.exitCode !== undefined
            ? `exit ${e.exitCode}`
            : "no exit code";
      const took = e.duration ? ` after ${formatStep(durationMs(e.duration))}` : "";
      return `call ${e.service} ended on ${e.execserver || "?"}: ${how}${took}${detail}`;
    }
    case ItemEventKind.REQUEUED:
      return `requeued${by}${attempt}${detail}`;
    case ItemEventKind.CANCEL_REQUESTED:
      return `cancel requested${detail}`;
    case ItemEventKind.CANCELLED:
      return `cancelled${by}${detail}`;
    case ItemEventKind.RETRIED:
      return "retried with fresh attempts";
    case ItemEventKind.SUCCEEDED:
      return `succeeded${by}${attempt}`;
    case ItemEventKind.FAILED:
      return `failed${by}${attempt}${detail}`;
    default:
      return `event ${e.kind}${detail}`;
  }
}

/** The timeline as text lines: number, time (UTC), time since the step before, what happened. */
export function timelineText(history: HistoryResponse): string[] {
  const rows = timelineRows(history);
  const lines = rows.map((r) => {
    const time = r.at ? r.at.toISOString().slice(11, 23) : "?";
    const since = formatSince(r.sincePreviousMs);
    return `${String(r.number).padStart(4)}  ${time}  ${since.padStart(9)}  ${r.what}`;
  });
  const dropped = history.eventsDropped > 0 ? [`      (${history.eventsDropped} earlier events no longer kept)`] : [];
  return [`   #  time (UTC)    +since    event`, ...dropped, ...lines];
}

/** "850ms", "12s", "2m 30s", "1h 5m". */
export function formatMs(ms: number): string {
  if (ms < 1000) return `${Math.round(ms)}ms`;
  const s = Math.round(ms / 1000);
  if (s < 60) return `${s}s`;
  const m = Math.floor(s / 60);
  if (m < 60) return s % 60 ? `${m}m ${s % 60}s` : `${m}m`;
  return m % 60 ? `${Math.floor(m / 60)}h ${m % 60}m` : `${Math.floor(m / 60)}h`;
}
