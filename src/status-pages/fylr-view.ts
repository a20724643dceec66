/**
 * The fylr status page's view model: admission as boxes, shares per instance, local
 * permits, the open queue by priority and state, pools, fylrs and recent items, from the
 * FylrPageData snapshot. Pure.
 */
import type { FylrPageData, PoolJson, RecentItemJson, ShareJson } from "./fylr-page-data.js";
import { topN, type TopN } from "./format.js";

/** How many rows the page draws before "and N more". */
export interface FylrViewLimits {
  readonly priorityRows: number;
  readonly fylrBars: number;
  readonly connectionChips: number;
}

/** Defaults of FylrViewLimits. */
export const defaultFylrViewLimits: FylrViewLimits = { priorityRows: 12, fylrBars: 12, connectionChips: 24 };

/** Open items at one priority, by state. */
export interface PriorityRow {
  readonly priority: number;
  readonly queued: number;
  readonly claimed: number;
  readonly running: number;
  readonly total: number;
  readonly exec: number;
  readonly local: number;
}

/** One instance share, with what the page needs to explain it. */
export interface ShareView extends ShareJson {
  readonly draining: boolean;
  readonly headroom: number;
}

/** Everything the fylr page draws. */
export interface FylrView {
  readonly fylrId: string;
  readonly state: string;
  readonly uptimeMs: number;
  /** Exec items held against the admission: boxes held (within), free, over (held beyond admission). */
  readonly exec: { readonly held: number; readonly admission: number; readonly within: number; readonly free: number; readonly over: number };
  /** Local permits: running, free for anyone, free but reserved for high priority. */
  readonly local: { readonly capacity: number; readonly running: number; readonly free: number; readonly reservedFree: number; readonly reserved: number };
  readonly shares: readonly ShareView[];
  readonly counters: Readonly<Record<string, number>>;
  readonly wants: { readonly parked: number; readonly running: number };
  readonly queueTotals: { readonly queued: number; readonly claimed: number; readonly running: number; readonly exec: number; readonly local: number };
  /** Priority rows, most urgent first. */
  readonly priorities: TopN<PriorityRow>;
  readonly pools: readonly PoolJson[];
  readonly fylrs: TopN<{ readonly id: string; readonly hostname: string; readonly held: number; readonly heartbeatAgeMs: number; readonly self: boolean }>;
  readonly recent: readonly (RecentItemJson & { readonly ageMs: number | undefined })[];
  /** Fairness keys with open items, most queued first, and how many keys have queued items. */
  readonly keys: { readonly top: readonly { key: string; queued: number; held: number }[]; readonly queuedKeys: number };
  readonly databaseError: string | undefined;
  readonly connectionChips: number;
}

/** Folds the open-item counts into rows per priority. */
export function priorityRows(queue: FylrPageData["queue"]): PriorityRow[] {
  const rows = new Map<number, { queued: number; claimed: number; running: number; exec: number; local: number }>();
  for (const q of queue) {
    const row = rows.get(q.priority) ?? { queued: 0, claimed: 0, running: 0, exec: 0, local: 0 };
    if (q.state === "queued" || q.state === "claimed" || q.state === "running") row[q.state] += q.count;
    row[q.kind] += q.count;
    rows.set(q.priority, row);
  }
  return [...rows]
    .map(([priority, r]) => ({ priority, ...r, total: r.queued + r.claimed + r.running }))
    .sort((a, b) => b.priority - a.priority);
}

/** Splits local permits into running, free and free-but-reserved-for-high-priority. */
export function localPermits(capacity: number, running: number, reserved: number): FylrView["local"] {
  const idle = Math.max(0, capacity - running);
  const reservedFree = Math.min(reserved, idle);
  return { capacity, running, free: idle - reservedFree, reservedFree, reserved };
}

/** Builds the view model from a snapshot (`now` in ms since epoch). */
export function fylrView(data: FylrPageData, now: number, limits: FylrViewLimits = defaultFylrViewLimits): FylrView {
  const d = data.dispatcher;
  const within = Math.min(d.execHeld, d.execAdmission);
  const draining = new Set(data.instances.filter((i) => i.draining).map((i) => i.instanceId));
  const rows = priorityRows(data.queue);
  const totals = { queued: 0, claimed: 0, running: 0, exec: 0, local: 0 };
  for (const r of rows) for (const k of ["queued", "claimed", "running", "exec", "local"] as const) totals[k] += r[k];
  const fylrs = data.fylrs.map((f) => ({ ...f, self: f.id === data.fylrId }));
  return {
    fylrId: data.fylrId,
    state: d.state,
    uptimeMs: Math.max(0, now - Date.parse(data.startedAt)),
    exec: { held: d.execHeld, admission: d.execAdmission, within, free: Math.max(0, d.execAdmission - d.execHeld), over: Math.max(0, d.execHeld - d.execAdmission) },
    local: localPermits(d.localCapacity, d.localRunning, d.localReservedForHigh),
    shares: data.shares.map((s) => ({ ...s, draining: draining.has(s.instanceId), headroom: d.headroom })),
    counters: d.counters,
    wants: data.wants,
    queueTotals: totals,
    // Claim order: the most urgent classes are the ones worth seeing.
    priorities: topN(rows, limits.priorityRows, (a, b) => b.priority - a.priority),
    pools: data.pools,
    fylrs: topN(fylrs, limits.fylrBars, (a, b) => Number(b.self) - Number(a.self) || b.held - a.held || a.id.localeCompare(b.id)),
    keys: data.keys ?? { top: [], queuedKeys: 0 },
    recent: data.recent.map((r) => ({ ...r, ageMs: r.updatedAt === undefined ? undefined : Math.max(0, now - Date.parse(r.updatedAt)) })),
    databaseError: data.databaseError,
    connectionChips: limits.connectionChips,
  };
}
