/**
 * The execserver status page's view model: GetStatus turned into the numbers the pictures
 * need (slots per waitgroup, the book by priority, grants per connection and how fair they
 * are, the busiest connections). Pure.
 */
import type { GetStatusResponse } from "../../gen/slotbroker/v1/broker_pb.js";
import { durationMs, timestampDate } from "@bufbuild/protobuf/wkt";
import { topN, type TopN } from "./format.js";
import { GrantWindow, type GrantWindowOptions, type WindowFairness } from "./grant-window.js";

/** How many rows the page draws before "and N more". */
export interface ExecViewLimits {
  /** Bars in the grants chart (default 20). */
  readonly grantBars: number;
  /** Rows of the connections table (default 25). */
  readonly connectionRows: number;
}

/** Defaults of ExecViewLimits. */
export const defaultExecViewLimits: ExecViewLimits = { grantBars: 20, connectionRows: 25 };

/** One waitgroup as drawn. */
export interface WaitgroupView {
  readonly name: string;
  readonly processes: number;
  /** Slots running a job, legacy jobs included. */
  readonly running: number;
  /** Slots held by an offer or a legacy token. */
  readonly offered: number;
  /** Of `running`: jobs that came through the legacy token protocol. */
  readonly legacyRunning: number;
  /** Of `offered`: slots held by an unredeemed legacy token. */
  readonly legacyTokens: number;
  readonly free: number;
  readonly waiting: number;
  readonly completed: number;
  readonly meanRuntimeMs: number | undefined;
  /** Services that run in it, sorted. */
  readonly services: readonly string[];
  /** Parked wants per priority class, most urgent first. */
  /** Per priority class: parked wants and the distinct fairness keys they are under. */
  readonly book: readonly { readonly priority: number; readonly wants: number; readonly keys: number }[];
}

/** One broker stream as drawn. */
export interface ConnectionView {
  readonly id: string;
  /** The client's name, or "" when it sent none. */
  readonly client: string;
  readonly peer: string;
  readonly ageMs: number | undefined;
  readonly parked: number;
  readonly offers: number;
  readonly grants: number;
  readonly declines: number;
  readonly expired: number;
  readonly rejects: number;
  readonly running: number;
  readonly done: number;
}

/** The legacy token protocol's counters, when the execserver serves it. */
export interface LegacyView {
  readonly tokensOutstanding: number;
  readonly jobsRunning: number;
  readonly jobsDone: number;
  readonly issued: number;
  readonly redeemed: number;
  readonly expired: number;
  readonly released: number;
  readonly refusedWantsParked: number;
  readonly refusedNoSlot: number;
  readonly notFound: number;
}

/** Sums over the connections a list left out. */
export type ConnectionTotals = Omit<ConnectionView, "id" | "client" | "peer" | "ageMs">;

/** Everything the execserver page draws. */
export interface ExecView {
  readonly instanceId: string;
  readonly draining: boolean;
  readonly uptimeMs: number | undefined;
  readonly waitgroups: readonly WaitgroupView[];
  readonly totals: { readonly processes: number; readonly running: number; readonly offered: number; readonly free: number; readonly waiting: number };
  readonly connectionCount: number;
  readonly totalGrants: number;
  /** Jain index over the recent grant rates of the connections that asked for anything (see GrantWindow). */
  readonly fairness: WindowFairness;
  /** The window the fairness is judged over. */
  readonly fairnessWindow: GrantWindowOptions;
  /** Connections by grants, most first. */
  readonly grants: TopN<ConnectionView>;
  /** Connections by activity (parked + running, then grants). */
  readonly connections: TopN<ConnectionView>;
  /** Sums over `connections.rest`. */
  readonly restTotals: ConnectionTotals;
  /** The token protocol's counters; undefined when it is off. */
  readonly legacy: LegacyView | undefined;
}

const counterKeys = ["parked", "offers", "grants", "declines", "expired", "rejects", "running", "done"] as const;

/** Sums the counters of some connections. */
export function sumConnections(rows: readonly ConnectionView[]): ConnectionTotals {
  const out = { parked: 0, offers: 0, grants: 0, declines: 0, expired: 0, rejects: 0, running: 0, done: 0 };
  for (const r of rows) for (const k of counterKeys) out[k] += r[k];
  return out;
}

function connectionView(c: GetStatusResponse["connections"][number], now: number): ConnectionView {
  const at = (c.connectedAt && timestampDate(c.connectedAt))?.getTime();
  return {
    id: c.connectionId,
    client: c.clientName,
    peer: c.peerAddress,
    ageMs: at === undefined ? undefined : Math.max(0, now - at),
    parked: Number(c.wantsParked),
    offers: Number(c.offers),
    grants: Number(c.grants),
    declines: Number(c.declines),
    expired: Number(c.expired),
    rejects: Number(c.rejects),
    running: c.running,
    done: Number(c.done),
  };
}

// Ties broken by client name, then id, so the picture does not shuffle between polls.
const byName = (a: ConnectionView, b: ConnectionView): number => a.client.localeCompare(b.client) || a.id.localeCompare(b.id);

/**
 * Builds the view model from a GetStatus snapshot taken at `now` (ms since epoch). `window`
 * keeps grant snapshots between calls (one per page); without it, fairness is judged over
 * the rates since each connection opened.
 */
export function execView(status: GetStatusResponse, now: number, limits: ExecViewLimits = defaultExecViewLimits, window = new GrantWindow()): ExecView {
  const servicesByGroup = new Map<string, string[]>();
  for (const [service, group] of Object.entries(status.services)) servicesByGroup.set(group, [...(servicesByGroup.get(group) ?? []), service]);
  const waitgroups: WaitgroupView[] = status.waitgroups.map((wg) => ({
    name: wg.name,
    processes: wg.processes,
    running: wg.running,
    offered: wg.offered,
    legacyRunning: wg.legacyRunning,
    legacyTokens: wg.legacyTokens,
    free: wg.free,
    waiting: Number(wg.waiting),
    completed: Number(wg.completed),
    meanRuntimeMs: wg.meanRuntime && durationMs(wg.meanRuntime),
    services: (servicesByGroup.get(wg.name) ?? []).sort(),
    book: [...wg.book].sort((a, b) => b.priority - a.priority).map((d) => ({ priority: d.priority, wants: Number(d.wants), keys: d.keys })),
  }));
  const totals = { processes: 0, running: 0, offered: 0, free: 0, waiting: 0 };
  for (const wg of waitgroups) {
    totals.processes += wg.processes;
    totals.running += wg.running;
    totals.offered += wg.offered;
    totals.free += wg.free;
    totals.waiting += wg.waiting;
  }
  const conns = status.connections.map((c) => connectionView(c, now));
  const connections = topN(conns, limits.connectionRows, (a, b) => b.parked + b.running - (a.parked + a.running) || b.grants - a.grants || byName(a, b));
  const started = (status.startedAt && timestampDate(status.startedAt))?.getTime();
  return {
    instanceId: status.instanceId,
    draining: status.draining,
    uptimeMs: started === undefined ? undefined : Math.max(0, now - started),
    waitgroups,
    totals,
    connectionCount: conns.length,
    totalGrants: conns.reduce((n, c) => n + c.grants, 0),
    fairness: window.fairness(now, conns),
    fairnessWindow: window.options,
    grants: topN(conns, limits.grantBars, (a, b) => b.grants - a.grants || b.parked - a.parked || byName(a, b)),
    connections,
    restTotals: sumConnections(connections.rest),
    legacy: status.legacy && {
      tokensOutstanding: status.legacy.tokensOutstanding,
      jobsRunning: status.legacy.jobsRunning,
      jobsDone: Number(status.legacy.jobsDone),
      issued: Number(status.legacy.tokensIssued),
      redeemed: Number(status.legacy.tokensRedeemed),
      expired: Number(status.legacy.tokensExpired),
      released: Number(status.legacy.tokensReleased),
      refusedWantsParked: Number(status.legacy.refusedWantsParked),
      refusedNoSlot: Number(status.legacy.refusedNoSlot),
      notFound: Number(status.legacy.tokensNotFound),
    },
  };
}
