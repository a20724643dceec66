/**
 * Completions that carry the next claim. Under a backlog every finished exec item freed a
 * place, and the claim pass it woke sent a claim statement right after the completion's:
 * two statements, two commits and two round trips per item. Here the claim rides in the
 * completion's own statement (one transaction): the completion is fenced exactly as
 * alone, and the claim takes the same rows, in the same order, with the same fylr-row
 * check as claimItems (sql.ts). The two touch disjoint rows (held vs queued).
 */
import type pg from "pg";
import type { ItemOutput } from "./output-sink.js";
import { itemFromRow, type ItemRow } from "./payload.js";
import { fromPgError } from "./pg-errors.js";
import * as sql from "./sql.js";
import { claimOrder, completeManyParams, completeParams, statementName } from "./store.js";
import type { CallResult, ClaimedItem, Fence } from "./types.js";

/** One success to write. */
export interface Completion {
  readonly fence: Fence;
  readonly results: readonly CallResult[];
  readonly output: ItemOutput | undefined;
  /** An exec item's: gives up its place in the exec admission (once the write landed). */
  readonly freePlace: (() => void) | undefined;
}

/** The claim that goes along: up to `limit` exec items for `fylrId`. */
export interface ClaimAlong {
  readonly fylrId: string;
  readonly limit: number;
}

/**
 * completeItem (sql.ts) and a claim. $1–$8 as completeItem, $9 the fylr, $10 the limit.
 * One row at least: `done` (1 when the fence let the completion through, else 0) and the
 * claimed item's columns, all null when nothing was claimed.
 */
export const completeItemAndClaim = `
WITH done AS (${sql.completeItem}), ${sql.claimCtes("$9::text", "'exec'", "(-2147483648)::integer", "$10::integer")}
SELECT d.done, k.* FROM (SELECT count(*)::int AS done FROM done) d LEFT JOIN claimed k ON true`;

/**
 * completeItems (sql.ts) and a claim. $1–$8 as completeItems, $9 the fylr, $10 the limit.
 * `done`: the "id/lease" texts of the completions the fences let through.
 */
export const completeItemsAndClaim = `
WITH done AS (${sql.completeItems}), ${sql.claimCtes("$9::text", "'exec'", "(-2147483648)::integer", "$10::integer")}
SELECT d.done, k.* FROM (SELECT coalesce(array_agg(id::text || '/' || lease::text), '{}') AS done FROM done) d LEFT JOIN claimed k ON true`;

type Row = Partial<ItemRow> & { done: number | string[] };

/** Writes the completions and claims; one boolean per completion (false: fenced) and the items claimed, in claim order. */
export async function completeAndClaim(pool: pg.Pool, entries: readonly Completion[], claim: ClaimAlong): Promise<{ written: boolean[]; items: ClaimedItem[] }> {
  const only = entries.length === 1 ? entries[0]! : undefined;
  const text = only ? completeItemAndClaim : completeItemsAndClaim;
  const params = [...(only ? completeParams(only.fence, only.results, only.output) : completeManyParams(entries)), claim.fylrId, claim.limit];
  let rows: Row[];
  try {
    rows = (await pool.query<Row>({ name: statementName(text), text, values: params })).rows;
  } catch (err) {
    throw fromPgError(err, "complete and claim");
  }
  const done = rows[0]?.done;
  const written = Array.isArray(done)
    ? ((set) => entries.map((e) => set.has(`${e.fence.id}/${e.fence.lease}`)))(new Set(done))
    : entries.map(() => done === 1);
  const items = rows.filter((r) => r.id != null).map((r) => itemFromRow(r as ItemRow) as ClaimedItem);
  return { written, items: items.sort(claimOrder) };
}
