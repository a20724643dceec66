// A dispatcher that drains no-op local items `concurrency` at a time and runs nothing on an
// execserver: what the claims bench and bench/pg-statements.ts measure the queue with.
import type pg from "pg";
import { Dispatcher, LocalActionRegistry, ManualCapacitySource, reservedForHigh, type ExecBackend } from "../../src/dispatcher/index.js";

const noExec: ExecBackend = { run: () => Promise.reject(new Error("no exec items in this benchmark")) };
const actions = new LocalActionRegistry().register("noop", { summary: "does nothing", run: () => Promise.resolve(Buffer.alloc(0)) });

/** A queued no-op local item's payload, as the dispatcher stores it. */
export const noopPayload = JSON.stringify({ local: { name: "noop", params: {}, input: "" } });

/** Local slots whose normal-priority share is exactly `c` (the rest is the high-priority reserve). */
function slotsForNormal(c: number): number {
  let slots = c;
  while (slots - reservedForHigh(slots) < c) slots += 1;
  return slots;
}

/** A dispatcher on an already migrated database, not started, claiming up to `concurrency` no-op items at once. */
export function noopDrainDispatcher(pool: pg.Pool, concurrency: number): Dispatcher {
  return new Dispatcher({
    pool,
    capacity: new ManualCapacitySource(),
    backend: noExec,
    actions,
    migrate: false,
    config: { localSlots: slotsForNormal(concurrency), maxClaimBatch: concurrency },
  });
}
