/**
 * Prometheus metrics of one fylr, in a registry of its own (several fylrs can live in one
 * process). Gauges and totals are read from the dispatcher and the broker at scrape time;
 * wakeups, connection drops and the items' ends, durations and slot waits are counted from
 * their events as they happen.
 */
import { Counter, Gauge, Histogram, Registry } from "prom-client";
import { runtimeMetrics } from "../shared/runtime-metrics.js";
import type { Dispatcher, DispatcherCounters } from "../dispatcher/index.js";
import type { BrokerClient } from "../fylr/index.js";
import { registerFylrBrokerMetrics } from "./fylr-broker-metrics.js";
import { registerFylrItemMetrics, type OfferedServices } from "./fylr-item-metrics.js";

/** The fylr's /metrics registry. */
export function createFylrMetrics(fylrId: string, dispatcher: Dispatcher, broker: BrokerClient, offered: OfferedServices): Registry {
  const registry = new Registry();
  registry.setDefaultLabels({ fylr_id: fylrId });
  runtimeMetrics();
  const registers = [registry];
  const counter = (name: string, help: string, key: keyof DispatcherCounters): void => {
    new Counter({
      name,
      help,
      registers,
      collect() {
        this.reset();
        this.inc(dispatcher.stats().counters[key]);
      },
    });
  };
  counter("slotbroker_fylr_claims_total", "Queue items claimed.", "claimed");
  counter("slotbroker_fylr_direct_claims_total", "Of the claims, submits through this fylr claimed in their own insert.", "claimedDirectly");
  counter("slotbroker_fylr_succeeded_total", "Items finished successfully.", "succeeded");
  counter("slotbroker_fylr_failed_total", "Items failed after their last attempt.", "failed");
  counter("slotbroker_fylr_requeues_total", "Items sent back to the queue (retry, no slot in time, given back on stop).", "requeued");
  counter("slotbroker_fylr_orphan_rescues_total", "Stale claims of dead fylrs requeued by this fylr.", "orphansRescued");
  counter("slotbroker_fylr_fenced_total", "Writes refused by the lease fence.", "fenced");
  counter("slotbroker_fylr_finished_items_deleted_total", "Finished item rows this fylr deleted after the queue's retention (queue.retention).", "finishedDeleted");
  new Gauge({
    name: "slotbroker_fylr_exec_items",
    help: "Exec items: held now, and the admission (sum of instance shares).",
    labelNames: ["kind"],
    registers,
    collect() {
      const s = dispatcher.stats();
      this.set({ kind: "held" }, s.execHeld);
      this.set({ kind: "admission" }, s.execAdmission);
    },
  });
  new Gauge({
    name: "slotbroker_fylr_local_slots",
    help: "Local-action slots: in use and in all.",
    labelNames: ["kind"],
    registers,
    collect() {
      const s = dispatcher.stats();
      this.set({ kind: "running" }, s.localRunning);
      this.set({ kind: "capacity" }, s.localCapacity);
    },
  });
  const wakeups = new Counter({
    name: "slotbroker_fylr_wakeups_total",
    help: "Dispatcher loop wakeups by source: notify (LISTEN/NOTIFY from any fylr), submit, finished, backlog, capacity, or poll (the interval passed).",
    labelNames: ["source"],
    registers,
  });
  for (const source of ["notify", "submit", "finished", "backlog", "capacity", "poll"]) wakeups.inc({ source }, 0);
  dispatcher.events.on("wakeup", (source) => wakeups.inc({ source }));
  new Gauge({
    name: "slotbroker_fylr_listening",
    help: "1 while the dispatcher's LISTEN connection is in place (wakeups within milliseconds), else 0 (the poll alone).",
    registers,
    collect() {
      this.set(dispatcher.listening ? 1 : 0);
    },
  });
  // Fairness keys without a series per key: how many keys have a claim turn, and one
  // histogram of how long this fylr's claimed exec items waited, whatever their key.
  let keysActive = 0;
  new Gauge({
    name: "slotbroker_fylr_fairness_keys_active",
    help: "Fairness keys with queued exec items (a claim turn), across all fylrs; the last value read when the database does not answer.",
    registers,
    async collect() {
      keysActive = await dispatcher.queue.countKeyTurns().catch(() => keysActive);
      this.set(keysActive);
    },
  });
  const wait = new Histogram({
    name: "slotbroker_fylr_claim_wait_seconds",
    help: "Exec items claimed by this fylr: seconds from due (submitted, or start_after) to claimed, all keys in one series.",
    buckets: [0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300, 900, 3600],
    registers,
  });
  dispatcher.events.on("item:claimed", (item) => {
    if (item.kind !== "exec" || !item.claimedAt) return;
    const due = Math.max(item.createdAt.getTime(), item.startAfter.getTime());
    wait.observe(Math.max(0, item.claimedAt.getTime() - due) / 1000);
  });
  registerFylrBrokerMetrics(registers, broker);
  registerFylrItemMetrics(registers, dispatcher, offered);
  return registry;
}
