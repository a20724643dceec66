import { Counter, Gauge, Histogram, Registry } from "prom-client";
import type { Broker, OfferOutcome } from "./broker.js";

const outcomes: readonly OfferOutcome[] = ["accepted", "declined", "expired", "withdrawn", "dropped"];

/**
 * Prometheus metrics of one execserver, in a registry of its own (several servers can
 * live in one process). Gauges read the broker at scrape time, so the grant path only
 * pays for the latency histogram and the outcome counter, both pre-bound to their labels.
 */
export class ExecserverMetrics {
  /** The registry `/metrics` renders. */
  readonly registry = new Registry();
  private readonly latency = new Map<string, Histogram.Internal<"waitgroup">>();
  private readonly outcomeCounters = new Map<OfferOutcome, Counter.Internal>();
  private readonly jobsDone: Counter<"waitgroup">;

  constructor(broker: Broker, instanceId: string) {
    this.registry.setDefaultLabels({ instance_id: instanceId });
    const registers = [this.registry];
    const wgs = [...broker.waitgroups.values()];
    new Gauge({
      name: "slotbroker_slots_total",
      help: "Slots (processes) per waitgroup.",
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
  }

  /** Records the WANT→OFFER time of one grant. */
  granted(waitgroup: string, seconds: number): void {
    this.latency.get(waitgroup)?.observe(seconds);
  }

  /** Counts how one offer ended. */
  offerEnded(outcome: OfferOutcome): void {
    this.outcomeCounters.get(outcome)?.inc();
  }

  /** Counts a finished job. */
  jobDone(waitgroup: string): void {
    this.jobsDone.inc({ waitgroup });
  }
}
