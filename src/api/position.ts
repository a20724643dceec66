/**
 * Where an item stands in line, merged from what each party knows — pure, no I/O:
 * - the database: queued items that would be claimed first (ahead_in_queue);
 * - the execserver's POSITION for a want this fylr has parked: slots running, capacity and
 *   the wants that would be offered a slot first (ahead_at_execserver);
 * - for an item not parked yet, the execserver's load of the service's waitgroup (its whole
 *   book is ahead of an item that has no want yet);
 * - an ETA hint from a mean runtime. "3 running, 7 waiting - you are number 11".
 */
import { create } from "@bufbuild/protobuf";
import { PositionState, type Position } from "../../gen/slotbroker/v1/broker_pb.js";
import { QueuePositionSchema, type QueuePosition } from "../../gen/slotbroker/v1/queue_pb.js";
import { itemStateToProto, type ItemKind, type ItemState, type LiveItem } from "../dispatcher/index.js";
import { durationFromMs, durationMs } from "@bufbuild/protobuf/wkt";
import { formatMs } from "./timeline.js";

/** The execservers' figures for the waitgroup of one service (from GetStatus). */
export interface ServiceLoad {
  /** Slots running a job. */
  readonly running: number;
  /** Slots in all. */
  readonly capacity: number;
  /** Wants parked in the waitgroup's book. */
  readonly waiting: number;
  /** The execserver's mean job runtime for the waitgroup, when it has history. */
  readonly meanRuntimeMs: number | undefined;
}

/** Looks up the load of a service's waitgroup; undefined when no execserver answers. */
export interface ExecLoadSource {
  load(service: string): Promise<ServiceLoad | undefined>;
}

/** Everything known about one item, gathered by the service; the input of buildPosition. */
export interface PositionFacts {
  readonly state: ItemState;
  readonly kind: ItemKind;
  /** The current (or, while queued, the first) call's service, or the local action's name. */
  readonly service: string | undefined;
  readonly startAfter: Date;
  /** Queued items of its kind that would be claimed before it (0 unless queued). */
  readonly aheadInQueue: number;
  readonly claimedBy: string | undefined;
  readonly error: string | undefined;
  /** This fylr's live view, when this fylr holds the item. */
  readonly live: LiveItem | undefined;
  /** Exec items: the execservers' load of the service's waitgroup. */
  readonly load: ServiceLoad | undefined;
  /** Local items: this fylr's local slots. */
  readonly local: { readonly running: number; readonly capacity: number } | undefined;
  /** This fylr's own mean runtime of the service. */
  readonly meanRuntimeMs: number | undefined;
  /** "Now", for the start_after hint. */
  readonly now: Date;
}

interface Line {
  running: number;
  capacity: number;
  aheadInQueue: number;
  aheadAtExecserver: number;
  etaMs: number | undefined;
  summary: string;
}

/** Builds the QueuePosition of an item from what the database, this fylr and the execservers know. */
export function buildPosition(facts: PositionFacts): QueuePosition {
  const line = describe(facts);
  return create(QueuePositionSchema, {
    state: itemStateToProto(facts.state),
    running: line.running,
    capacity: line.capacity,
    aheadInQueue: line.aheadInQueue,
    aheadAtExecserver: line.aheadAtExecserver,
    ahead: line.aheadInQueue + line.aheadAtExecserver,
    eta: line.etaMs === undefined ? undefined : durationFromMs(line.etaMs),
    summary: line.summary,
  });
}

function describe(f: PositionFacts): Line {
  const empty: Line = { running: 0, capacity: 0, aheadInQueue: 0, aheadAtExecserver: 0, etaMs: undefined, summary: "" };
  if (f.state === "succeeded") return { ...empty, summary: "succeeded" };
  if (f.state === "failed") return { ...empty, summary: f.error ? `failed: ${f.error}` : "failed" };
  if (f.state === "cancelled") return { ...empty, summary: "cancelled" };
  const slots = f.kind === "local" ? f.local : f.load;
  const base = { ...empty, running: slots?.running ?? 0, capacity: slots?.capacity ?? 0 };
  const parked = f.live?.phase === "waiting" ? f.live.position : undefined;
  if (f.state === "running" || f.live?.phase === "running" || parked?.state === PositionState.RUNNING) {
    return { ...base, summary: runningSummary(f) };
  }
  if (parked && (parked.state === PositionState.PARKED || parked.state === PositionState.OFFERED)) return atExecserver(f, parked);
  if (f.state === "claimed") {
    const owner = f.live ? "claimed by this fylr" : `claimed by fylr ${f.claimedBy ?? "?"}`;
    const load = f.load ? ` (${f.load.running} running, ${f.load.waiting} waiting at the execservers)` : "";
    return { ...base, summary: `${owner}, waiting for a slot${load}` };
  }
  return queued(f, base);
}

function atExecserver(f: PositionFacts, p: Position): Line {
  const mean = f.meanRuntimeMs ?? f.load?.meanRuntimeMs;
  const etaMs = (p.eta && durationMs(p.eta)) ?? estimateMs(p.ahead, p.running, p.capacity, mean);
  const line = { running: p.running, capacity: p.capacity, aheadInQueue: 0, aheadAtExecserver: p.ahead, etaMs };
  if (p.state === PositionState.OFFERED) return { ...line, summary: `${p.running} running - a slot is being offered to you` };
  return { ...line, summary: lineSummary(p.running, p.ahead, etaMs) };
}

function queued(f: PositionFacts, base: Line): Line {
  // A want parked now is offered a slot before an item that has no want yet.
  const aheadAtExecserver = f.kind === "exec" ? (f.load?.waiting ?? 0) : 0;
  const ahead = f.aheadInQueue + aheadAtExecserver;
  const mean = f.meanRuntimeMs ?? (f.kind === "exec" ? f.load?.meanRuntimeMs : undefined);
  const later = f.startAfter.getTime() - f.now.getTime();
  const wait = later > 0 ? later : 0;
  const estimate = estimateMs(ahead, base.running, base.capacity, mean);
  const etaMs = estimate === undefined ? (wait > 0 ? wait : undefined) : Math.max(estimate, wait);
  const known = f.kind === "local" ? f.local !== undefined : f.load !== undefined;
  let summary = known ? lineSummary(base.running, ahead, etaMs) : `${ahead} waiting - you are number ${ahead + 1}`;
  if (wait > 0) summary = `not before ${f.startAfter.toISOString()} (in ${formatMs(wait)}); ${summary}`;
  return { ...base, aheadInQueue: f.aheadInQueue, aheadAtExecserver, etaMs, summary };
}

function runningSummary(f: PositionFacts): string {
  const live = f.live;
  const what = f.service ? ` ${f.service}` : "";
  if (!live) return `running${what}${f.claimedBy ? ` (fylr ${f.claimedBy})` : ""}`;
  const call = live.callCount > 1 ? ` (call ${live.callIndex + 1} of ${live.callCount})` : "";
  const where = live.instanceId ? ` on ${live.instanceId}` : "";
  return `running${what}${call}${where}`;
}

/** "3 running, 7 waiting - you are number 11, about 40s". */
function lineSummary(running: number, ahead: number, etaMs: number | undefined): string {
  const eta = etaMs === undefined ? "" : `, about ${formatMs(etaMs)}`;
  return `${running} running, ${ahead} waiting - you are number ${running + ahead + 1}${eta}`;
}

/**
 * A summary without its clock-driven parts (the ETA and the start_after countdown), so that
 * Watch sends an update when the line changes, not every time a second passes.
 */
export function summaryWithoutTimes(summary: string): string {
  return summary.replace(/, about [^,;]+$/, "").replace(/ \(in [^)]+\)/, "");
}

/**
 * Time until a slot comes: nothing while a slot is free for it, else one mean runtime per
 * `capacity` wants that must be served first. Undefined without a mean or slots.
 */
export function estimateMs(ahead: number, running: number, capacity: number, meanMs: number | undefined): number | undefined {
  if (meanMs === undefined || capacity <= 0) return undefined;
  const free = Math.max(0, capacity - running);
  if (ahead < free) return 0;
  return Math.round((meanMs * (ahead - free + 1)) / capacity);
}

