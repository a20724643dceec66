/**
 * The items' side of a fylr's /metrics: how the items this fylr finished ended, how long
 * they took from submit, how long their calls waited for a slot, and the cancels asked
 * through it — counted from the dispatcher's events as they happen.
 *
 * Every label value comes from a bounded set: the state, and the service, which is an
 * exec call's service as the connected execservers' config names it, or a local action's
 * name. An item whose service no connected execserver offers (it can be submitted while
 * none is connected) counts as service "other", so a submitter cannot mint series.
 */
import { Counter, Histogram, type Registry } from "prom-client";
import type { ClaimedItem, Dispatcher, ItemState } from "../dispatcher/index.js";

/** Whether a connected execserver offers `service` now: what the service label may name besides local actions. */
export type OfferedServices = (service: string) => boolean;

type FinalState = "succeeded" | "failed" | "cancelled";
const cancelledFrom: readonly ItemState[] = ["queued", "claimed", "running"];

/** Registers the item metric families in `registers`. */
export function registerFylrItemMetrics(registers: Registry[], dispatcher: Dispatcher, offered: OfferedServices): void {
  const serviceOf = (item: ClaimedItem): string => {
    if (item.kind === "local") return item.local?.name ?? "other";
    const service = item.calls[0]?.service;
    return service !== undefined && offered(service) ? service : "other";
  };
  const finished = new Counter({
    name: "slotbroker_fylr_items_finished_total",
    help: "Items this fylr wrote in a final state, by state and service (the first call's, or the local action's name; \"other\" for a service no connected execserver offers).",
    labelNames: ["state", "service"],
    registers,
  });
  const duration = new Histogram({
    name: "slotbroker_fylr_item_duration_seconds",
    help: "From submit to the final state, for the items this fylr finished, by service: queueing, retries and runs together.",
    labelNames: ["service"],
    buckets: [0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600],
    registers,
  });
  const slotWait = new Histogram({
    name: "slotbroker_fylr_slot_wait_seconds",
    help: "From an exec call's WANT to its slot's grant (the JOB sent), by the call's service.",
    labelNames: ["service"],
    buckets: [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300],
    registers,
  });
  const cancels = new Counter({
    name: "slotbroker_fylr_cancel_requests_total",
    help: "Cancels asked through this fylr that changed an item, by the state it was in (queued and claimed end at once; running is stopped at its execserver).",
    labelNames: ["from"],
    registers,
  });
  for (const from of cancelledFrom) cancels.inc({ from }, 0);
  const ended = (state: FinalState, item: ClaimedItem): void => {
    const service = serviceOf(item);
    finished.inc({ state, service });
    duration.observe({ service }, Math.max(0, Date.now() - item.createdAt.getTime()) / 1000);
  };
  dispatcher.events.on("item:succeeded", (item) => ended("succeeded", item));
  dispatcher.events.on("item:failed", (item) => ended("failed", item));
  dispatcher.events.on("item:cancelled", (item) => ended("cancelled", item));
  dispatcher.events.on("call:done", (_item, result) => {
    if (result.timing) slotWait.observe({ service: result.service }, result.timing.slotWaitMs / 1000);
  });
  dispatcher.events.on("cancel:asked", (from) => cancels.inc({ from }));
}
