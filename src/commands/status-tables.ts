/** The text tables of `slotbroker status`, pure: statuses in, aligned lines out. */
import type { GetStatusResponse } from "../../gen/slotbroker/v1/broker_pb.js";
import type { FylrStatusJson } from "../app/fylr-routes.js";
import { formatMs } from "../api/timeline.js";
import { durationMs } from "@bufbuild/protobuf/wkt";

type Cell = string | number | bigint;

/** Aligned columns; numbers right-aligned, text left-aligned. */
export function formatTable(headers: readonly string[], rows: readonly (readonly Cell[])[]): string {
  const text = rows.map((row) => row.map(String));
  const numeric = headers.map((_, c) => rows.length > 0 && rows.every((row) => typeof row[c] !== "string"));
  const widths = headers.map((h, c) => Math.max(h.length, ...text.map((row) => (row[c] ?? "").length)));
  const line = (cells: readonly string[]): string =>
    cells
      .map((cell, c) => (numeric[c] ? cell.padStart(widths[c]!) : cell.padEnd(widths[c]!)))
      .join("  ")
      .trimEnd();
  return [line(headers), ...text.map(line)].join("\n");
}

/** One execserver: header line, waitgroups, book depth by priority, connections. */
export function execserverSection(address: string, s: GetStatusResponse): string {
  const parts = [`EXECSERVER ${s.instanceId} at ${address}${s.draining ? " (draining)" : ""}, ${s.connections.length} connection(s)`];
  parts.push(
    formatTable(
      ["WAITGROUP", "SLOTS", "RUNNING", "OFFERED", "FREE", "WAITING", "DONE", "MEAN RUNTIME"],
      s.waitgroups.map((w) => {
        const mean = w.meanRuntime && durationMs(w.meanRuntime);
        return [w.name, w.processes, w.running, w.offered, w.free, w.waiting, w.completed, mean === undefined ? "-" : formatMs(mean)];
      }),
    ),
  );
  const book = s.waitgroups.flatMap((w) => w.book.map((d) => [w.name, d.priority, d.wants, d.keys] as const));
  parts.push(book.length === 0 ? "book: empty (no wants parked)" : formatTable(["BOOK", "PRIORITY", "WANTS", "KEYS"], book));
  if (s.connections.length > 0) {
    parts.push(
      formatTable(
        ["CLIENT", "PEER", "PARKED", "OFFERS", "GRANTS", "DECLINES", "RUNNING", "DONE"],
        s.connections.map((c) => [c.clientName || "-", c.peerAddress, c.wantsParked, c.offers, c.grants, c.declines, c.running, c.done]),
      ),
    );
  }
  return parts.join("\n\n");
}

/** The queue by kind and state, and the live fylrs. */
export function queueSection(status: FylrStatusJson, api: string): string {
  const states = ["queued", "claimed", "running"] as const;
  const kinds = [...new Set(["exec", "local", ...status.queue.map((q) => q.kind)])];
  const count = (kind: string, state: string): number => status.queue.find((q) => q.kind === kind && q.state === state)?.count ?? 0;
  const stats = status.stats as { fylrId?: string; execHeld?: number; execAdmission?: number; localRunning?: number; localCapacity?: number };
  const parts = [
    `QUEUE (unfinished items, all fylrs) via ${api}`,
    formatTable(
      ["KIND", ...states.map((s) => s.toUpperCase())],
      kinds.map((k) => [k, ...states.map((s) => count(k, s))]),
    ),
    formatTable(
      ["FYLR", "HOST", "PID", "HELD", "HEARTBEAT"],
      status.fylrs.map((f) => [f.id, f.hostname, f.pid, f.held, f.heartbeatAt]),
    ),
    ...(status.keys && status.keys.top.length > 0
      ? [
          `KEYS (fairness keys with open items, most queued first; ${status.keys.queuedKeys} with queued items)`,
          formatTable(
            ["KEY", "QUEUED", "HELD"],
            // A key is any text a submitter chose: one with control characters is shown escaped.
            status.keys.top.map((k) => [k.key === "" ? "(default)" : JSON.stringify(k.key).slice(1, -1) === k.key ? k.key : JSON.stringify(k.key), k.queued, k.held]),
          ),
        ]
      : []),
    `this fylr (${stats.fylrId ?? "?"}): exec ${stats.execHeld ?? 0} held of ${stats.execAdmission ?? 0} admitted; local ${stats.localRunning ?? 0} of ${stats.localCapacity ?? 0} slots`,
  ];
  return parts.join("\n\n");
}
