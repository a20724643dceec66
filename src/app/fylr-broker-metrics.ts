/**
 * The broker client's side of a fylr's /metrics: offers, wants, connections and the polling
 * fallback, all read from the client at scrape time but for connection drops (counted from
 * the client's events).
 */
import { Counter, Gauge, type Registry } from "prom-client";
import type { BrokerClient } from "../fylr/index.js";

/** Registers the broker client's metric families in `registers`. */
export function registerFylrBrokerMetrics(registers: Registry[], broker: BrokerClient): void {
  // The fylr's side of offer outcomes: a declined offer lost a race to another connection's.
  new Counter({
    name: "slotbroker_fylr_offers_total",
    help: "Offers this fylr answered: accepted (JOB) or declined (its want was already served elsewhere).",
    labelNames: ["outcome"],
    registers,
    collect() {
      this.reset();
      this.inc({ outcome: "accepted" }, broker.stats.accepted);
      this.inc({ outcome: "declined" }, broker.stats.declined);
    },
  });
  new Counter({
    name: "slotbroker_fylr_offers_substituted_total",
    help: "Surplus offers (their want already won elsewhere) taken by the next want parked on the same connection instead of declined; counted among the accepted offers too.",
    registers,
    collect() {
      this.reset();
      this.inc(broker.stats.substituted);
    },
  });
  new Counter({
    name: "slotbroker_fylr_no_slot_total",
    help: "Wants that got no offer within connectTimeout (their items go back to the queue).",
    registers,
    collect() {
      this.reset();
      this.inc(broker.stats.noSlot);
    },
  });
  new Gauge({
    name: "slotbroker_fylr_pool_connections",
    help: "Broker connections per configured execserver address, by state.",
    labelNames: ["address", "state"],
    registers,
    collect() {
      this.reset();
      for (const pool of broker.pools()) {
        const counts = new Map<string, number>();
        for (const conn of pool.connections()) counts.set(conn.state, (counts.get(conn.state) ?? 0) + 1);
        for (const [state, n] of counts) this.set({ address: pool.address, state }, n);
      }
    },
  });
  const drops = new Counter({ name: "slotbroker_fylr_connection_drops_total", help: "Ready broker connections whose stream ended.", labelNames: ["address"], registers });
  broker.events.on("connection:down", (conn) => drops.inc({ address: conn.address }));
  new Gauge({
    name: "slotbroker_fylr_pool_transport",
    help: "How each configured execserver address is reached: 1 for its transport (broker streams, or polling the old token protocol).",
    labelNames: ["address", "transport"],
    registers,
    collect() {
      this.reset();
      for (const pool of broker.pools()) {
        this.set({ address: pool.address, transport: "broker" }, pool.transport === "broker" ? 1 : 0);
        this.set({ address: pool.address, transport: "polling" }, pool.transport === "polling" ? 1 : 0);
      }
    },
  });
  new Counter({
    name: "slotbroker_fylr_polling_total",
    help: "The polling fallback: GET /token requests sent and slots won by a token.",
    labelNames: ["kind"],
    registers,
    collect() {
      this.reset();
      this.inc({ kind: "token_requests" }, broker.stats.tokenRequests);
      this.inc({ kind: "slots" }, broker.stats.polled);
    },
  });
  new Gauge({
    name: "slotbroker_fylr_instances",
    help: "Distinct execserver instances connected.",
    registers,
    collect() {
      this.set(broker.instances().length);
    },
  });
  new Gauge({
    name: "slotbroker_fylr_wants",
    help: "Wants parked at execservers, and jobs sent and not yet done.",
    labelNames: ["state"],
    registers,
    collect() {
      this.set({ state: "parked" }, broker.parked);
      this.set({ state: "running" }, broker.running);
    },
  });
}
