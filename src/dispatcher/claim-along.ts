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
import { encodeResults, itemFromRow, type ItemRow } from "./payload.js";
import { fromPgError } from "./pg-errors.js";
import { storableJson } from "./storable.js";
import { claimOrder, statementName } from "./store.js";
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

const claimCtes = (fylr: string, limit: string): string => `
next AS (
  SELECT id FROM queue_items
  WHERE state = 'queued' AND kind = 'exec' AND start_after <= now()
    AND EXISTS (SELECT 1 FROM fylrs WHERE id = ${fylr})
  ORDER BY priority DESC, start_after, seq
  LIMIT ${limit}
  FOR UPDATE SKIP LOCKED
), claimed AS (
  UPDATE queue_items q
  SET state = 'claimed', claimed_by = ${fylr}, lease = q.lease + 1, attempts = q.attempts + 1,
      claimed_at = now(), updated_at = now()
  FROM next
  WHERE q.id = next.id
  RETURNING q.*
)`;

/**
 * completeItem (sql.ts) and a claim. $1–$8 as completeItem, $9 the fylr, $10 the limit.
 * One row at least: `done` (1 when the fence let the completion through, else 0) and the
 * claimed item's columns, all null when nothing was claimed.
 */
export const completeItemAndClaim = `
WITH done AS (
  UPDATE queue_items
  SET state = 'succeeded', result = $4, output = $5, output_blob = $6, output_size = $7, output_sha256 = $8,
      error = NULL, finished_at = now(), updated_at = now()
  WHERE id = $1 AND claimed_by = $2 AND lease = $3 AND state IN ('claimed', 'running')
  RETURNING id
), ${claimCtes("$9::text", "$10::integer")}
SELECT d.done, k.* FROM (SELECT count(*)::int AS done FROM done) d LEFT JOIN claimed k ON true`;

/**
 * completeItems (sql.ts) and a claim. $1–$8 as completeItems, $9 the fylr, $10 the limit.
 * `done`: the "id/lease" texts of the completions the fences let through.
 */
export const completeItemsAndClaim = `
WITH done AS (
  UPDATE queue_items q
  SET state = 'succeeded', result = c.result, output = c.output, output_blob = c.output_blob, output_size = c.output_size,
      output_sha256 = c.output_sha256, error = NULL, finished_at = now(), updated_at = now()
  FROM unnest($1::uuid[], $2::text[], $3::bigint[], $4::jsonb[], $5::bytea[], $6::uuid[], $7::bigint[], $8::text[])
    AS c(id, claimed_by, lease, result, output, output_blob, output_size, output_sha256)
  WHERE q.id = c.id AND q.claimed_by = c.claimed_by AND q.lease = c.lease AND q.state IN ('claimed', 'running')
  RETURNING q.id, q.lease
), ${claimCtes("$9::text", "$10::integer")}
SELECT d.done, k.* FROM (SELECT coalesce(array_agg(id::text || '/' || lease::text), '{}') AS done FROM done) d LEFT JOIN claimed k ON true`;

type Row = Partial<ItemRow> & { done: number | string[] };

/** Writes the completions and claims; one boolean per completion (false: fenced) and the items claimed, in claim order. */
export async function completeAndClaim(pool: pg.Pool, entries: readonly Completion[], claim: ClaimAlong): Promise<{ written: boolean[]; items: ClaimedItem[] }> {
  const only = entries.length === 1 ? entries[0]! : undefined;
  const outputs = entries.map((e) => outputParams(e.output));
  const text = only ? completeItemAndClaim : completeItemsAndClaim;
  const o = outputs[0]!;
  const params = only
    ? [only.fence.id, only.fence.claimedBy, only.fence.lease, storableJson(encodeResults(only.results)), o.bytes, o.blob, o.size, o.sha256, claim.fylrId, claim.limit]
    : [
        entries.map((e) => e.fence.id),
        entries.map((e) => e.fence.claimedBy),
        entries.map((e) => e.fence.lease),
        entries.map((e) => JSON.stringify(storableJson(encodeResults(e.results)))),
        outputs.map((o) => o.bytes),
        outputs.map((o) => o.blob),
        outputs.map((o) => o.size),
        outputs.map((o) => o.sha256),
        claim.fylrId,
        claim.limit,
      ];
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

// As the store writes them.
function outputParams(output: ItemOutput | undefined): { bytes: Buffer | null; blob: string | null; size: number | null; sha256: string | null } {
  if (!output) return { bytes: null, blob: null, size: null, sha256: null };
  return { bytes: output.bytes, blob: output.blobId ?? null, size: output.size, sha256: output.sha256 };
}
