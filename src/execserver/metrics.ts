import { Counter, Gauge, Histogram, Registry } from "prom-client";
import type { Events } from "../shared/events.js";
import type { BrokerCore, OfferOutcome } from "./broker-core.js";
import type { ExecserverEvents } from "./events.js";

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

  constructor(broker: BrokerCore, instanceId: string, events: Events<ExecserverEvents>, now: () => number) {
    this.registry.setDefaultLabels({ instance_id: instanceId });
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
        for (const wg of wgs) {
          this.set({ waitgroup: wg.name, state: "running" }, wg.ledger.running);
          this.set({ waitgroup: wg.name, state: "offered" }, wg.ledger.offered);
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
    this.jobsDone = new Counter({ name: "slotbroker_jobs_done_total", help: "Jobs finished.", labelNames: ["waitgroup"], registers });
    for (const wg of wgs) this.latency.set(wg.name, latency.labels({ waitgroup: wg.name }));
    for (const o of outcomes) this.outcomeCounters.set(o, outcome.labels({ outcome: o }));
    // Every known series exists from the first scrape (at zero), so rate() and alerts on
    // them work before the first grant, decline or expiry instead of seeing "no data".
    for (const wg of wgs) {
      latency.zero({ waitgroup: wg.name });
      this.jobsDone.inc({ waitgroup: wg.name }, 0);
    }
    for (const o of outcomes) outcome.inc({ outcome: o }, 0);
    events.on("offered", (record) => this.granted(record.group.name, (now() - record.wantedAt) / 1000));
    events.on("offer:ended", (_record, o) => this.offerEnded(o));
    events.on("job:done", (record) => this.jobDone(record.group.name));
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

  /** Counts a finished job. */
  jobDone(waitgroup: string): void {
    this.pendingDone.set(waitgroup, (this.pendingDone.get(waitgroup) ?? 0) + 1);
  }

  /** Renders the registry in the Prometheus text format. */
  async render(): Promise<string> {
    this.flush();
    return this.registry.metrics();
  }

  /** Folds buffered events into prom-client. */
  flush(): void {
    for (let i = 0; i < this.pendingCount; i++) this.latency.get(this.pendingLatencyWaitgroups[i]!)?.observe(this.pendingLatencies[i]!);
    this.pendingCount = 0;
    for (const [outcome, n] of this.pendingOutcomes) this.outcomeCounters.get(outcome)?.inc(n);
    this.pendingOutcomes.clear();
    for (const [waitgroup, n] of this.pendingDone) this.jobsDone.inc({ waitgroup }, n);
    this.pendingDone.clear();
  }

}
