import { Counter, Gauge, Histogram, Registry } from "prom-client";
import type { Events } from "../shared/typed-events.js";
import { renderWithRuntime, runtimeMetrics } from "../shared/runtime-metrics.js";
import type { BrokerCore, OfferOutcome, Waitgroup } from "./broker-core.js";
import type { ExecserverEvents } from "./events.js";
import { IdleGaps } from "./idle-gaps.js";
import type { LegacyTokens } from "./legacy/tokens.js";

// Latency samples buffered between scrapes before they are folded in early.
const maxPending = 4096;

const outcomes: readonly OfferOutcome[] = ["accepted", "declined", "expired", "withdrawn", "dropped"];

/**
 * Prometheus metrics of one execserver, in a registry of its own (several servers can
 * live in one process). Gauges read the broker at scrape time; counters and the latency
 * histogram follow the execserver's events. Events on the grant path are only appended to
 * a buffer and folded into prom-client at scrape time (or when the buffer fills), so an
 * idle-slot grant pays a few array writes, not label hashing.
 */
export class ExecserverMetrics {
  /** The registry `/metrics` renders. */
  readonly registry = new Registry();
  private readonly latency = new Map<string, Histogram.Internal<"waitgroup">>();
  private readonly outcomeCounters = new Map<OfferOutcome, Counter.Internal>();
  private readonly jobsDone: Counter<"waitgroup">;
  private readonly pendingLatencyWaitgroups: string[] = [];
  private readonly pendingLatencies: number[] = [];
  private pendingCount = 0;
  private readonly pendingOutcomes = new Map<OfferOutcome, number>();
  private readonly pendingDone = new Map<string, number>();
  private readonly gaps = new Map<string, IdleGaps>();
  private readonly gapSeries = new Map<string, Histogram.Internal<"waitgroup">>();
  private readonly frames = new Map<string, number>();
  private readonly framesCounter: Counter<"kind">;
  private readonly legacyRequests: Counter<"endpoint" | "code">;
  // Per waitgroup: slot-milliseconds spent running jobs up to `since`, and the jobs running since then.
  private readonly busy = new Map<string, { ms: number; running: number; since: number }>();

  constructor(broker: BrokerCore, instanceId: string, events: Events<ExecserverEvents>, now: () => number, legacy?: LegacyTokens) {
    this.registry.setDefaultLabels({ instance_id: instanceId });
    runtimeMetrics();
    const registers = [this.registry];
    const wgs = [...broker.waitgroups.values()];
    new Gauge({
      name: "slotbroker_slots",
      help: "Slots (processes) per waitgroup, busy or not.",
      labelNames: ["waitgroup"],
      registers,
      collect() {
        for (const wg of wgs) this.set({ waitgroup: wg.name }, wg.ledger.processes);
      },
    });
    new Gauge({
      name: "slotbroker_slots_used",
      help: "Slots in use per waitgroup: running a job or held by an offer.",
      labelNames: ["waitgroup", "state"],
      registers,
      collect() {
        // A partition: broker offers and jobs, legacy tokens and jobs; the states sum to the slots in use.
        for (const wg of wgs) {
          const l = legacy?.countsOf(wg) ?? { tokens: 0, running: 0 };
          this.set({ waitgroup: wg.name, state: "running" }, wg.ledger.running - l.running);
          this.set({ waitgroup: wg.name, state: "offered" }, wg.ledger.offered - l.tokens);
          if (!legacy) continue;
          this.set({ waitgroup: wg.name, state: "legacy_running" }, l.running);
          this.set({ waitgroup: wg.name, state: "legacy_token" }, l.tokens);
        }
      },
    });
    new Gauge({
      name: "slotbroker_book_depth",
      help: "Wants parked in the want-book per waitgroup and priority.",
      labelNames: ["waitgroup", "priority"],
      registers,
      collect() {
        this.reset();
        for (const wg of wgs) for (const d of wg.book.depth()) this.set({ waitgroup: wg.name, priority: String(d.priority) }, d.wants);
      },
    });
    // A count per class, never a series per key: keys are unbounded, classes are not.
    new Gauge({
      name: "slotbroker_book_keys",
      help: "Distinct fairness keys with wants parked, per waitgroup and priority.",
      labelNames: ["waitgroup", "priority"],
      registers,
      collect() {
        this.reset();
        for (const wg of wgs) for (const d of wg.book.depth()) this.set({ waitgroup: wg.name, priority: String(d.priority) }, d.keys);
      },
    });
    new Gauge({
      name: "slotbroker_connections",
      help: "Open broker streams.",
      registers,
      collect() {
        this.set(broker.connections.size);
      },
    });
    const latency = new Histogram({
      name: "slotbroker_grant_latency_seconds",
      help: "Time from WANT to OFFER.",
      labelNames: ["waitgroup"],
      buckets: [0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.1, 1, 10, 60, 600],
      registers,
    });
    const outcome = new Counter({ name: "slotbroker_offer_outcomes_total", help: "How offers ended.", labelNames: ["outcome"], registers });
    this.jobsDone = new Counter({ name: "slotbroker_jobs_done_total", help: "Jobs run through the broker, finished (legacy jobs: slotbroker_legacy_jobs_done_total).", labelNames: ["waitgroup"], registers });
    for (const wg of wgs) this.latency.set(wg.name, latency.labels({ waitgroup: wg.name }));
    for (const o of outcomes) this.outcomeCounters.set(o, outcome.labels({ outcome: o }));
    // Every known series exists from the first scrape (at zero), so rate() and alerts on
    // them work before the first grant, decline or expiry instead of seeing "no data".
    for (const wg of wgs) {
      latency.zero({ waitgroup: wg.name });
      this.jobsDone.inc({ waitgroup: wg.name }, 0);
    }
    for (const o of outcomes) outcome.inc({ outcome: o }, 0);
    const gap = new Histogram({
      name: "slotbroker_slot_idle_gap_seconds",
      help: "From a slot freeing to the next job running in its waitgroup (while work waits; gaps over 3 s count as no demand and are not observed).",
      labelNames: ["waitgroup"],
      buckets: [0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1, 1.25, 1.5, 2, 3],
      registers,
    });
    for (const wg of wgs) {
      this.gaps.set(wg.name, new IdleGaps(wg.ledger.processes));
      this.gapSeries.set(wg.name, gap.labels({ waitgroup: wg.name }));
      gap.zero({ waitgroup: wg.name });
    }
    this.framesCounter = new Counter({
      name: "slotbroker_frames_received_total",
      help: "Broker frames received from fylrs, by kind.",
      labelNames: ["kind"],
      registers,
    });
    for (const kind of ["want", "unwant", "job", "decline", "ping", "query", "cancel"]) this.framesCounter.inc({ kind }, 0);
    this.legacyRequests = new Counter({
      name: "slotbroker_legacy_requests_total",
      help: "Requests to the legacy token protocol, by endpoint and HTTP status.",
      labelNames: ["endpoint", "code"],
      registers,
    });
    const busy = this.busy;
    for (const wg of wgs) busy.set(wg.name, { ms: 0, running: 0, since: now() });
    new Counter({
      name: "slotbroker_slot_busy_seconds_total",
      help: "Slot-seconds spent running jobs (broker and legacy) per waitgroup: its rate over the slots is the utilisation.",
      labelNames: ["waitgroup"],
      registers,
      collect() {
        this.reset();
        const at = now();
        for (const [waitgroup, b] of busy) this.inc({ waitgroup }, busyMs(b, at) / 1000);
      },
    });
    if (legacy) this.legacyGauges(legacy, wgs, registers);
    events.on("offered", (record) => this.granted(record.group.name, (now() - record.wantedAt) / 1000));
    events.on("offer:ended", (_record, o) => this.offerEnded(o));
    events.on("job:started", (record) => this.slotTaken(record.group.name, now()));
    events.on("job:done", (record) => {
      this.jobDone(record.group.name);
      this.slotFreed(record.group.name, now());
    });
    events.on("legacy:started", (token) => this.slotTaken(token.group.name, now()));
    events.on("legacy:done", (token) => this.slotFreed(token.group.name, now()));
    events.on("legacy:request", (endpoint, code) => this.legacyRequests.inc({ endpoint, code: String(code) }));
  }

  private legacyGauges(legacy: LegacyTokens, wgs: readonly Waitgroup[], registers: Registry[]): void {
    new Counter({
      name: "slotbroker_legacy_tokens_total",
      help: "Legacy tokens by what became of them.",
      labelNames: ["outcome"],
      registers,
      collect() {
        const t = legacy.totals;
        this.reset();
        for (const [outcome, n] of [["issued", t.issued], ["redeemed", t.redeemed], ["expired", t.expired], ["released", t.released]] as const) {
          this.inc({ outcome }, n);
        }
      },
    });
    new Counter({
      name: "slotbroker_legacy_refused_total",
      help: "Legacy requests refused, by reason (token-not-found: a PUT /job whose token this instance does not hold).",
      labelNames: ["reason"],
      registers,
      collect() {
        this.reset();
        for (const [reason, n] of Object.entries(legacy.totals.refused)) this.inc({ reason }, n);
        this.inc({ reason: "token-not-found" }, legacy.totals.notFound);
      },
    });
    new Counter({
      name: "slotbroker_legacy_jobs_done_total",
      help: "Jobs run through the legacy token protocol, finished.",
      labelNames: ["waitgroup"],
      registers,
      collect() {
        this.reset();
        for (const wg of wgs) this.inc({ waitgroup: wg.name }, legacy.countsOf(wg).done);
      },
    });
  }

  /** Records the WANT→OFFER time of one grant. */
  granted(waitgroup: string, seconds: number): void {
    this.pendingLatencyWaitgroups[this.pendingCount] = waitgroup;
    this.pendingLatencies[this.pendingCount] = seconds;
    this.pendingCount++;
    if (this.pendingCount >= maxPending) this.flush();
  }

  /** Counts how one offer ended. */
  offerEnded(outcome: OfferOutcome): void {
    this.pendingOutcomes.set(outcome, (this.pendingOutcomes.get(outcome) ?? 0) + 1);
  }

  /** Counts a finished broker job. */
  jobDone(waitgroup: string): void {
    this.pendingDone.set(waitgroup, (this.pendingDone.get(waitgroup) ?? 0) + 1);
  }

  /** A slot of the waitgroup was freed at `now` by a finished job (broker or legacy). */
  slotFreed(waitgroup: string, now: number): void {
    this.slotBusy(waitgroup, now, -1);
    this.gaps.get(waitgroup)?.freed(now);
  }

  /** A job (broker or legacy) started running in the waitgroup at `now`: observes the slot's idle gap. */
  slotTaken(waitgroup: string, now: number): void {
    this.slotBusy(waitgroup, now, 1);
    const gap = this.gaps.get(waitgroup)?.taken(now);
    if (gap !== undefined) this.gapSeries.get(waitgroup)?.observe(gap / 1000);
  }

  private slotBusy(waitgroup: string, now: number, delta: 1 | -1): void {
    const b = this.busy.get(waitgroup);
    if (!b) return;
    busyMs(b, now);
    b.running = Math.max(0, b.running + delta);
  }

  /** Counts one frame received from a fylr. */
  frameReceived(kind: string): void {
    this.frames.set(kind, (this.frames.get(kind) ?? 0) + 1);
  }


  /** Renders the registry in the Prometheus text format, with the process's runtime families. */
  async render(): Promise<string> {
    this.flush();
    return renderWithRuntime(this.registry);
  }

  /** Folds buffered events into prom-client. */
  flush(): void {
    for (let i = 0; i < this.pendingCount; i++) this.latency.get(this.pendingLatencyWaitgroups[i]!)?.observe(this.pendingLatencies[i]!);
    this.pendingCount = 0;
    for (const [outcome, n] of this.pendingOutcomes) this.outcomeCounters.get(outcome)?.inc(n);
    this.pendingOutcomes.clear();
    for (const [waitgroup, n] of this.pendingDone) this.jobsDone.inc({ waitgroup }, n);
    this.pendingDone.clear();
    for (const [kind, n] of this.frames) this.framesCounter.inc({ kind }, n);
    this.frames.clear();
  }

}

// Brings a waitgroup's busy slot-milliseconds up to `at` and returns them.
function busyMs(b: { ms: number; running: number; since: number }, at: number): number {
  if (at > b.since) {
    b.ms += b.running * (at - b.since);
    b.since = at;
  }
  return b.ms;
}
