/**
 * Claims this fylr holds in the database but not in memory. A claim statement (a pass's,
 * one carried by a success, a submit claimed in its insert) can commit while its answer
 * never arrives (the connection dies between the commit and the reply): the rows say this
 * fylr holds the items, no task runs them, and while this fylr lives no sibling's sweep
 * touches them. The audit finds such rows, old enough that no answer can still be on its
 * way, and gives them back to the queue, fenced by their lease (a row settled or claimed
 * again meanwhile is left alone).
 */
import { fromPgError } from "./pg-errors.js";
import { statementName, type QueueStore } from "./store.js";
import type { Fence } from "./types.js";

/** $1 this fylr, $2 the age in ms a claim must have before it counts as lost. */
export const claimsOlderThan = `
SELECT id, claimed_by, lease FROM queue_items
WHERE claimed_by = $1 AND state IN ('claimed', 'running')
  AND claimed_at < now() - $2::double precision * interval '1 millisecond'`;

/** How old a claim must be before the audit may call it lost: well past any answer. */
export function lostClaimAgeMs(staleAfterMs: number): number {
  return 4 * staleAfterMs;
}

/**
 * Gives back this fylr's claims older than `ageMs` that `held()` does not list; resolves
 * with the fences given back. `held` is asked after the rows are read, so a task that
 * started meanwhile still counts as held.
 */
export async function releaseLostClaims(store: QueueStore, fylrId: string, ageMs: number, held: () => readonly string[]): Promise<Fence[]> {
  let rows: Fence[];
  try {
    type Row = { id: string; claimed_by: string; lease: string };
    const result = await store.pool.query<Row>({ name: statementName(claimsOlderThan), text: claimsOlderThan, values: [fylrId, ageMs] });
    rows = result.rows.map((r) => ({ id: r.id, claimedBy: r.claimed_by, lease: Number(r.lease) }));
  } catch (err) {
    throw fromPgError(err, "audit of held claims");
  }
  if (rows.length === 0) return [];
  const known = new Set(held());
  const lost = rows.filter((r) => !known.has(r.id));
  const released: Fence[] = [];
  for (const fence of lost) if (await store.release(fence, 0)) released.push(fence);
  return released;
}
