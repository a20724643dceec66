/**
 * Every runtime query of the dispatcher, one named constant per purpose, `$n` parameters.
 * Durations are passed in milliseconds and scaled in SQL; all times are the database's
 * `now()`, so fylrs with skewed clocks still agree on staleness and start_after.
 *
 * Owner writes are fenced: `WHERE id = $1 AND claimed_by = $2 AND lease = $3` plus a held
 * state. A write from an older claim (requeued since, or claimed again by anyone) matches
 * no row, and the caller logs the refusal.
 */

import { callEventCount, eventCtes, eventSelect, settleEventSelects } from "./event-sql.js";

/**
 * What an insert returns: the columns the database decides. The others hold what the
 * submit gave (or nothing yet), so the row is completed from it (payload.insertedItem)
 * instead of parsing its payload and a score of empty columns back.
 */
const insertedColumns = "id, state, claimed_by, lease, start_after, attempts, created_at, claimed_at, updated_at";

/**
 * Submit. $1 kind, $2 priority, $3 payload, $4 start_after (null = now), $5 max_attempts,
 * $6 idempotency_key, $7 the submitting fylr when it may claim the item directly (else null),
 * $8 traceparent (null when untraced), $9 fairness_key, $10 fairness_weight, $11
 * fairness_limit (null = none). Empty result = key taken; else the inserted columns above.
 *
 * With $7 the item is inserted already claimed by that fylr (lease 1, attempts 1,
 * claimed_at: what a claim writes) when the claim's own rules hold at this statement: the
 * item is exec-bound and eligible now, the fylr has a row (one declared dead claims
 * nothing), and no eligible exec item of its priority or higher is queued (it never goes
 * ahead of older work). Otherwise it is queued, exactly as without $7. Its events:
 * submitted, and claimed when it was.
 *
 * The sub-select keeps a plan made for given values from dropping the direct-claim checks:
 * without it the plans for queued and for direct submits differ in cost, and Postgres,
 * weighing the cached generic plan against their average, planned many calls afresh.
 */
export const insertItem = `
WITH inserted AS (
INSERT INTO queue_items (kind, priority, payload, start_after, max_attempts, idempotency_key, traceparent,
                         state, claimed_by, lease, attempts, claimed_at, events, fairness_key, fairness_weight, fairness_limit)
SELECT $1::text, $2::integer, $3::jsonb, d.start_after, $5::integer, $6::text, $8::text,
       CASE WHEN d.direct THEN 'claimed' ELSE 'queued' END,
       CASE WHEN d.direct THEN $7::text END,
       CASE WHEN d.direct THEN 1 ELSE 0 END,
       CASE WHEN d.direct THEN 1 ELSE 0 END,
       CASE WHEN d.direct THEN now() END,
       CASE WHEN d.direct THEN 2 ELSE 1 END,
       $9::text, $10::integer, $11::integer
FROM (
  SELECT s.start_after,
         (SELECT $7::text IS NOT NULL AND $1::text = 'exec') AND s.start_after <= now()
           AND EXISTS (SELECT 1 FROM fylrs WHERE id = $7::text)
           AND NOT EXISTS (
             SELECT 1 FROM queue_items q
             WHERE q.state = 'queued' AND q.kind = 'exec' AND q.priority >= $2::integer AND q.start_after <= now()
           ) AS direct
  FROM (SELECT coalesce($4::timestamptz, now()) AS start_after) s
) d
ON CONFLICT (idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
RETURNING ${insertedColumns}
), ${eventCtes("inserted_events", 
  eventSelect({ item: "id", n: "1", kind: "'submitted'", from: "inserted" }),
  eventSelect({ item: "id", n: "2", kind: "'claimed'", fylr: "claimed_by", attempt: "attempts", from: "inserted", where: "state = 'claimed'" }),
)}
SELECT * FROM inserted`;

/**
 * Submits queued together (group insert). Arrays of equal length, in arrival order: $1 ids
 * (chosen by the caller, to tell the returned rows apart), $2 kinds, $3 priorities, $4
 * payloads, $5 start_after (null = now), $6 max_attempts, $7 idempotency keys, $8
 * traceparents (null = untraced), $9 fairness keys, $10 fairness weights, $11 fairness
 * limits (null = none). Inserted in
 * that order (seq follows it), returning the inserted columns above; an entry whose key is
 * taken (also by an earlier entry of the same batch) is not inserted and returns no row.
 */
export const insertQueuedItems = `
WITH inserted AS (
INSERT INTO queue_items (id, kind, priority, payload, start_after, max_attempts, idempotency_key, traceparent, events,
                         fairness_key, fairness_weight, fairness_limit)
SELECT s.id, s.kind, s.priority, s.payload, coalesce(s.start_after, now()), s.max_attempts, s.idempotency_key, s.traceparent, 1,
       s.fairness_key, s.fairness_weight, s.fairness_limit
FROM unnest($1::uuid[], $2::text[], $3::integer[], $4::jsonb[], $5::timestamptz[], $6::integer[], $7::text[], $8::text[],
            $9::text[], $10::integer[], $11::integer[])
  WITH ORDINALITY AS s(id, kind, priority, payload, start_after, max_attempts, idempotency_key, traceparent,
                       fairness_key, fairness_weight, fairness_limit, n)
ORDER BY s.n
ON CONFLICT (idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
RETURNING ${insertedColumns}
), ${eventCtes("inserted_events", eventSelect({ item: "id", n: "1", kind: "'submitted'", from: "inserted" }))}
SELECT * FROM inserted`;

/** The item holding an idempotency key. $1 key. */
export const selectItemByKey = `SELECT * FROM queue_items WHERE idempotency_key = $1`;

/** One item. $1 id. */
export const selectItem = `SELECT * FROM queue_items WHERE id = $1`;

/**
 * Claim up to $3 queued exec items with priority ≥ $2 whose start_after has come, in claim
 * order (priority, then fairness keys in weighted turn, then oldest first within a key), for
 * fylr $1: slotbroker_claim_exec of migrations 0010 and 0013. Items are taken SKIP LOCKED, so
 * concurrent claimers take disjoint rows; each claim bumps the lease and counts an attempt.
 * A fylr without a row (declared dead and not yet back) claims nothing: its claims would be
 * orphans at once. Rows come back in claim order.
 */
export const claimExecItems = `
WITH ${claimCtes("$1::text", "$2::integer", "$3::integer")}
SELECT * FROM claimed ORDER BY ordinality`;

/**
 * The exec claim as CTEs, `claimed` (the claimed rows, in claim order) and their events,
 * so a completion can carry it (group-commit.ts). Arguments are SQL expressions: the fylr,
 * the lowest priority, the limit.
 */
export function claimCtes(fylr: string, minPriority: string, limit: string): string {
  return `claimed AS (
  SELECT * FROM slotbroker_claim_exec(${fylr}, ${minPriority}, ${limit}) WITH ORDINALITY AS c
), ${eventCtes("claimed_events", eventSelect({ item: "id", n: "events", kind: "'claimed'", fylr: "claimed_by", attempt: "attempts", from: "claimed" }))}`;
}

/**
 * Claim up to $4 queued items of kind $2 (local) with priority ≥ $3 whose start_after has
 * come, oldest first within a priority, for fylr $1. Tests use it to look at local items
 * the way claimLocalItems takes them, without permits.
 */
export const claimItems = `
WITH next AS (
  SELECT id FROM queue_items
  WHERE state = 'queued' AND kind = $2 AND priority >= $3 AND start_after <= now()
    AND EXISTS (SELECT 1 FROM fylrs WHERE id = $1)
  ORDER BY priority DESC, start_after, seq
  LIMIT $4
  FOR UPDATE SKIP LOCKED
), claimed AS (
  UPDATE queue_items q
  SET state = 'claimed', claimed_by = $1, lease = q.lease + 1, attempts = q.attempts + 1,
      claimed_at = now(), updated_at = now(), events = q.events + 1
  FROM next
  WHERE q.id = next.id
  RETURNING q.*
), ${eventCtes("claimed_events", eventSelect({ item: "id", n: "events", kind: "'claimed'", fylr: "claimed_by", attempt: "attempts", from: "claimed" }))}
SELECT * FROM claimed`;

/**
 * Claim local items for fylr $1 in one statement, honouring the high-priority reserve of
 * the local semaphore: up to $3 items (all free permits) in claim order, of which items
 * with priority < $2 ("normal") only as many as $4 (the permits normal items may take)
 * minus the high-priority items taken along — the same rule LocalPermits applies, so every
 * claimed item gets its permit. Candidates locked but not chosen are unlocked when the
 * statement ends. Local items start at once, so they go straight to 'running'.
 *
 * The candidates' LIMIT is a literal, `total` rounded up to a power of two (claimLocalLimit):
 * with `LIMIT $3` the plan cached for the prepared statement guesses a tenth of the table,
 * so Postgres planned the statement afresh on every call (most of its cost).
 */
export function claimLocalItems(total: number): string {
  return `WITH ${claimLocalCtes("$1::text", "$2::integer", "$3::integer", "$4::integer", total)}
SELECT * FROM claimed`;
}

/** The literal candidates LIMIT of a local claim of `total` items. */
export function claimLocalLimit(total: number): number {
  return 2 ** Math.ceil(Math.log2(Math.max(1, total)));
}

/**
 * claimLocalItems as CTEs, `claimed` (the claimed rows) and their events, so a completion
 * can carry it (group-commit.ts). Arguments are SQL expressions: the fylr, the high
 * priority, the total, the normal permits; `total` the most the total will be.
 */
export function claimLocalCtes(fylr: string, highPriority: string, total: string, normal: string, most: number): string {
  return `candidates AS (
  SELECT id, priority, start_after, seq FROM queue_items
  WHERE state = 'queued' AND kind = 'local' AND start_after <= now()
    AND EXISTS (SELECT 1 FROM fylrs WHERE id = ${fylr})
  ORDER BY priority DESC, start_after, seq
  LIMIT ${claimLocalLimit(most)}
  FOR UPDATE SKIP LOCKED
), firsts AS (
  SELECT * FROM candidates ORDER BY priority DESC, start_after, seq LIMIT ${total}
), ranked AS (
  SELECT id, priority >= ${highPriority} AS high,
         row_number() OVER (PARTITION BY priority >= ${highPriority} ORDER BY priority DESC, start_after, seq) AS n,
         count(*) FILTER (WHERE priority >= ${highPriority}) OVER () AS highs
  FROM firsts
), claimed AS (
UPDATE queue_items q
SET state = 'running', claimed_by = ${fylr}, lease = q.lease + 1, attempts = q.attempts + 1,
    claimed_at = now(), updated_at = now(), events = q.events + 2
FROM ranked
WHERE q.id = ranked.id AND (ranked.high OR ranked.n <= ${normal} - ranked.highs)
RETURNING q.*
), ${eventCtes("claimed_events", 
    eventSelect({ item: "id", n: "events - 1", kind: "'claimed'", fylr: "claimed_by", attempt: "attempts", from: "claimed" }),
    eventSelect({ item: "id", n: "events", kind: "'running'", fylr: "claimed_by", attempt: "attempts", from: "claimed" }),
  )}`;
}

/** The claim query's SELECT alone, for EXPLAIN in tests. Same parameters minus $1. */
export const explainClaimPath = `
EXPLAIN SELECT id FROM queue_items
WHERE state = 'queued' AND kind = $1 AND priority >= $2 AND start_after <= now()
ORDER BY priority DESC, start_after, seq
LIMIT $3
FOR UPDATE SKIP LOCKED`;

const runningEvent = eventCtes("marked_events", eventSelect({ item: "id", n: "events", kind: "'running'", fylr: "claimed_by", attempt: "attempts", from: "marked" }));

/** claimed → running (the slot came). Fenced: $1 id, $2 claimed_by, $3 lease. */
export const markRunning = `
WITH marked AS (
UPDATE queue_items SET state = 'running', updated_at = now(), events = events + 1
WHERE id = $1 AND claimed_by = $2 AND lease = $3 AND state = 'claimed'
RETURNING id, state, events, claimed_by, attempts
), ${runningEvent}
SELECT state FROM marked`;

/**
 * claimed → running for a batch of items, each fenced by its own (id, claimed_by, lease).
 * Arrays of equal length: $1 ids, $2 owners, $3 leases. Returns the written entries' positions
 * (1-based) in the arrays.
 */
export const markRunningMany = `
WITH marked AS (
UPDATE queue_items q SET state = 'running', updated_at = now(), events = q.events + 1
FROM unnest($1::uuid[], $2::text[], $3::bigint[]) WITH ORDINALITY AS m(id, claimed_by, lease, n)
WHERE q.id = m.id AND q.claimed_by = m.claimed_by AND q.lease = m.lease AND q.state = 'claimed'
RETURNING m.n, q.id, q.events, q.claimed_by, q.attempts
), ${runningEvent}
SELECT n FROM marked`;

/**
 * → succeeded. Fenced ($1–$3); $4 result, $5 output (whole, or the first bytes of a stored
 * one), $6 output_blob, $7 output_size, $8 output_sha256. Recording output_blob adopts the
 * stored output (trigger of migration 0004). As CTEs, `done` (the written row) and its
 * events (the calls', then succeeded), so a claim can go along (group-commit.ts).
 */
export const completeItemCtes = `done AS (
  UPDATE queue_items
  SET state = 'succeeded', result = $4, output = $5, output_blob = $6, output_size = $7, output_sha256 = $8,
      error = NULL, finished_at = now(), updated_at = now(), events = events + 1 + ${callEventCount("$4::jsonb")}
  WHERE id = $1 AND claimed_by = $2 AND lease = $3 AND state IN ('claimed', 'running')
  RETURNING id, state, events, attempts
), ${eventCtes("done_events", ...settleEventSelects("done", "$4::jsonb", "$2::text", { kind: "'succeeded'" }))}`;

/** completeItemCtes alone: one row (`state`) when the fence let it through. */
export const completeItem = `WITH ${completeItemCtes} SELECT state FROM done`;

/**
 * → succeeded for a batch of items, each fenced by its own (id, claimed_by, lease). Arrays
 * of equal length: $1 ids, $2 owners, $3 leases, $4 results, $5 outputs, $6 output blobs,
 * $7 output sizes, $8 output digests. As CTEs like completeItemCtes: `done` holds the
 * (id, lease) pairs that were written; the others were refused by the fence.
 */
export const completeItemsCtes = `done AS (
  UPDATE queue_items q
  SET state = 'succeeded', result = c.result, output = c.output, output_blob = c.output_blob, output_size = c.output_size,
      output_sha256 = c.output_sha256, error = NULL, finished_at = now(), updated_at = now(),
      events = q.events + 1 + ${callEventCount("c.result")}
  FROM unnest($1::uuid[], $2::text[], $3::bigint[], $4::jsonb[], $5::bytea[], $6::uuid[], $7::bigint[], $8::text[])
    AS c(id, claimed_by, lease, result, output, output_blob, output_size, output_sha256)
  WHERE q.id = c.id AND q.claimed_by = c.claimed_by AND q.lease = c.lease AND q.state IN ('claimed', 'running')
  RETURNING q.id, q.lease, q.events, q.attempts, q.claimed_by, c.result
), ${eventCtes("done_events", ...settleEventSelects("done", "done.result", "done.claimed_by", { kind: "'succeeded'" }))}`;

/** completeItemsCtes alone: the written (id, lease) pairs. */
export const completeItems = `WITH ${completeItemsCtes} SELECT id, lease FROM done`;

/**
 * A failed attempt. Fenced ($1–$3); $4 result, $5 error, $6 retry delay ms, $7 permanent.
 * With attempts left and not permanent: back to queued after the delay. Otherwise: failed.
 * A cancel asked for meanwhile wins over both: cancelled. Events: the calls', then
 * requeued, failed or cancelled.
 */
export const failAttempt = `
WITH settled AS (
UPDATE queue_items
SET state       = CASE WHEN cancel_requested_at IS NOT NULL THEN 'cancelled'
                       WHEN attempts < max_attempts AND NOT $7::boolean THEN 'queued' ELSE 'failed' END,
    claimed_by  = CASE WHEN attempts < max_attempts AND NOT $7::boolean AND cancel_requested_at IS NULL THEN NULL ELSE claimed_by END,
    start_after = CASE WHEN attempts < max_attempts AND NOT $7::boolean AND cancel_requested_at IS NULL
                       THEN now() + $6::double precision * interval '1 millisecond' ELSE start_after END,
    finished_at = CASE WHEN attempts < max_attempts AND NOT $7::boolean AND cancel_requested_at IS NULL THEN NULL ELSE now() END,
    result = $4, error = $5, updated_at = now(), events = events + 1 + ${callEventCount("$4::jsonb")}
WHERE id = $1 AND claimed_by = $2 AND lease = $3 AND state IN ('claimed', 'running')
RETURNING id, state, events, attempts
), ${eventCtes("settled_events", 
  ...settleEventSelects("settled", "$4::jsonb", "$2::text", {
    kind: "CASE WHEN settled.state = 'queued' THEN 'requeued' ELSE settled.state END",
    detail: "CASE WHEN settled.state = 'queued' THEN 'after a failed attempt: ' ELSE '' END || $5::text",
  }),
)}
SELECT state FROM settled`;

/**
 * Give an item back without spending its attempt: no slot in time ($4 = one minute), or
 * stopped before it could finish ($4 = 0). Fenced ($1–$3). An item whose cancel was asked
 * for is cancelled instead: it never goes back to the queue.
 */
export const releaseItem = `
WITH released AS (
UPDATE queue_items
SET state       = CASE WHEN cancel_requested_at IS NULL THEN 'queued' ELSE 'cancelled' END,
    claimed_by  = CASE WHEN cancel_requested_at IS NULL THEN NULL ELSE claimed_by END,
    attempts    = CASE WHEN cancel_requested_at IS NULL THEN greatest(attempts - 1, 0) ELSE attempts END,
    finished_at = CASE WHEN cancel_requested_at IS NULL THEN finished_at ELSE now() END,
    error       = CASE WHEN cancel_requested_at IS NULL THEN error ELSE 'cancelled by request' END,
    start_after = now() + $4::double precision * interval '1 millisecond', updated_at = now(), events = events + 1
WHERE id = $1 AND claimed_by = $2 AND lease = $3 AND state IN ('claimed', 'running')
RETURNING id, state, events, attempts
), ${eventCtes("released_events", 
  eventSelect({
    item: "id",
    n: "events",
    kind: "CASE WHEN state = 'queued' THEN 'requeued' ELSE state END",
    fylr: "$2::text",
    attempt: "attempts",
    detail: `CASE WHEN state = 'cancelled' THEN 'cancelled by request'
                  WHEN $4::double precision > 0 THEN 'no slot in time; the attempt given back'
                  ELSE 'given back unfinished (its fylr stopped or was declared dead)' END`,
    from: "released",
  }),
)}
SELECT state FROM released`;

/**
 * A held item ends cancelled (its job stopped on request). Fenced ($1–$3); $4 result (the
 * receipts, the stopped job's included), $5 error. An item of this claim that a Cancel
 * already ended while it was 'claimed' (its job had started but was not yet written
 * running, dispatcher.runningMarkDelay) gets the receipts it has none of; its end time stays.
 * Events: the calls', then cancelled.
 */
export const finishCancelled = `
WITH settled AS (
UPDATE queue_items
SET state = 'cancelled', result = $4, error = $5, cancel_requested_at = coalesce(cancel_requested_at, now()),
    finished_at = CASE WHEN state = 'cancelled' THEN finished_at ELSE now() END, updated_at = now(),
    events = events + 1 + ${callEventCount("$4::jsonb")}
WHERE id = $1 AND claimed_by = $2 AND lease = $3
  AND (state IN ('claimed', 'running')
       OR (state = 'cancelled' AND result IS NULL AND jsonb_array_length($4::jsonb -> 'calls') > 0))
RETURNING id, state, events, attempts
), ${eventCtes("settled_events", ...settleEventSelects("settled", "$4::jsonb", "$2::text", { kind: "'cancelled'", detail: "$5::text" }))}
SELECT state FROM settled`;

/**
 * Cancel. $1 id. A queued or claimed item becomes 'cancelled' at once; a running one gets
 * cancel_requested_at (kept from a first request). The row lock orders this against a
 * claim, a completion or another cancel of the same row: each sees the other's result.
 * Held items notify "cancel <id>" so the fylr holding it (whichever that is) stops it.
 * No row: unknown, or already finished (the caller reads the state to say which).
 */
export const cancelItem = `
WITH target AS (
  SELECT id, state FROM queue_items WHERE id = $1 FOR UPDATE
), changed AS (
  UPDATE queue_items q
  SET state               = CASE WHEN t.state = 'running' THEN 'running' ELSE 'cancelled' END,
      finished_at         = CASE WHEN t.state = 'running' THEN q.finished_at ELSE now() END,
      error               = CASE WHEN t.state = 'running' THEN q.error ELSE 'cancelled by request' END,
      cancel_requested_at = coalesce(q.cancel_requested_at, now()),
      updated_at          = now(),
      events              = q.events + 1
  FROM target t
  WHERE q.id = t.id AND t.state IN ('queued', 'claimed', 'running')
  RETURNING q.*, t.state AS previous_state
), ${eventCtes("changed_events", 
  eventSelect({
    item: "id",
    n: "events",
    kind: "CASE WHEN state = 'running' THEN 'cancel-requested' ELSE 'cancelled' END",
    attempt: "attempts",
    detail: "'by request'",
    from: "changed",
  }),
)}
SELECT changed.*,
       CASE WHEN previous_state IN ('claimed', 'running') THEN pg_notify('slotbroker_queue', 'cancel ' || id) END AS notified
FROM changed`;

/**
 * Held items whose cancel was asked for longer than $1 ms ago and never settled (their
 * fylr is gone or its execserver never answered): cancelled now, by any fylr.
 */
export const cancelOverdue = `
WITH overdue AS (
UPDATE queue_items
SET state = 'cancelled', finished_at = now(), updated_at = now(), events = events + 1,
    error = 'cancelled by request; the job was not confirmed stopped within the cancel bound'
WHERE cancel_requested_at IS NOT NULL AND state IN ('claimed', 'running')
  AND cancel_requested_at < now() - $1::double precision * interval '1 millisecond'
RETURNING id, events, attempts, error
), ${eventCtes("overdue_events", eventSelect({ item: "id", n: "events", kind: "'cancelled'", attempt: "attempts", detail: "error", from: "overdue" }))}
SELECT id FROM overdue`;

/** Of the items with these ids ($1 uuid[]), those cancelled or with a cancel pending: the holder's check. */
export const cancelledAmong = `
SELECT id FROM queue_items
WHERE id = ANY($1::uuid[]) AND (state = 'cancelled' OR cancel_requested_at IS NOT NULL)`;

/**
 * Retry. $1 id. A failed or cancelled item goes back to the queue with fresh attempts; the
 * results, output and stored outputs of its earlier run go (an uploaded input stays: the
 * item reads it again). No row: unknown, or not failed/cancelled. Its event: retried.
 */
export const retryItem = `
WITH target AS (
  SELECT id FROM queue_items WHERE id = $1 AND state IN ('failed', 'cancelled') FOR UPDATE
), dropped AS (
  DELETE FROM blobs b USING target WHERE b.item_id = target.id AND b.role <> 'input'
), retried AS (
  UPDATE queue_items q
  SET state = 'queued', claimed_by = NULL, attempts = 0, start_after = now(), finished_at = NULL,
      result = NULL, output = NULL, output_blob = NULL, output_size = NULL, output_sha256 = NULL,
      error = NULL, cancel_requested_at = NULL, updated_at = now(), events = q.events + 1
  FROM target
  WHERE q.id = target.id
  RETURNING q.*
), ${eventCtes("retried_events", eventSelect({ item: "id", n: "events", kind: "'retried'", from: "retried" }))}
SELECT * FROM retried`;

/**
 * Delete. $1 id. Only a finished item; its stored inputs and outputs go with it (ON DELETE
 * CASCADE). Returns the number of items deleted and of blobs they owned.
 */
export const deleteItem = `
WITH gone AS (
  DELETE FROM queue_items WHERE id = $1 AND state IN ('succeeded', 'failed', 'cancelled') RETURNING id
)
SELECT (SELECT count(*) FROM gone)::int AS items,
       (SELECT count(*) FROM blobs b WHERE b.item_id IN (SELECT id FROM gone))::int AS blobs`;

/** Register a fylr. $1 id, $2 hostname, $3 pid, $4 api_url, $5 version. */
export const registerFylr = `
INSERT INTO fylrs (id, hostname, pid, api_url, version) VALUES ($1, $2, $3, $4, $5)`;

/** Whether migration $1 is applied. */
export const migrationApplied = `SELECT EXISTS (SELECT 1 FROM slotbroker_migrations WHERE version = $1) AS found`;

/** Heartbeat. $1 id. No row: a sibling declared this fylr dead and removed it. */
export const heartbeatFylr = `UPDATE fylrs SET heartbeat_at = now() WHERE id = $1`;

/** Goodbye on graceful stop; any claims left behind become orphans at once. $1 id. */
export const deregisterFylr = `DELETE FROM fylrs WHERE id = $1`;

/**
 * The survivors' sweep. $1 stale threshold ms, $2 this fylr's id.
 *
 * Removes fylr rows whose heartbeat is older than the threshold, and in the same statement
 * requeues every held item whose owner has no fresh row (stale, removed now, or gone
 * already) — except this fylr's own. An item that has used its last attempt is failed
 * instead, so an item that crashes its fylr cannot loop forever.
 *
 * Safe under concurrency: the DELETE holds the stale rows' locks, so a paused owner's
 * heartbeat waits and then finds its row gone (and learns it was declared dead); a second
 * sweeper waits on the item rows, re-checks `state` after the first commits and skips
 * them. Nothing is requeued twice.
 */
export const reapStale = `
WITH dead AS (
  DELETE FROM fylrs
  WHERE heartbeat_at < now() - $1::double precision * interval '1 millisecond' AND id <> $2
  RETURNING id
), stale AS (
  SELECT q.id, q.claimed_by AS owner FROM queue_items q
  WHERE q.state IN ('claimed', 'running') AND q.claimed_by <> $2
    AND NOT EXISTS (
      SELECT 1 FROM fylrs f
      WHERE f.id = q.claimed_by AND f.heartbeat_at >= now() - $1::double precision * interval '1 millisecond'
    )
), orphans AS (
  -- Re-checked on the current row version: a row another sweeper requeued (or someone
  -- claimed again) since this statement's snapshot no longer matches and is skipped.
  -- An item whose cancel was asked for is never resurrected: it ends cancelled.
  UPDATE queue_items q
  SET state       = CASE WHEN q.cancel_requested_at IS NOT NULL THEN 'cancelled'
                         WHEN q.attempts < q.max_attempts THEN 'queued' ELSE 'failed' END,
      claimed_by  = CASE WHEN q.attempts < q.max_attempts AND q.cancel_requested_at IS NULL THEN NULL ELSE q.claimed_by END,
      finished_at = CASE WHEN q.attempts < q.max_attempts AND q.cancel_requested_at IS NULL THEN NULL ELSE now() END,
      error       = CASE WHEN q.cancel_requested_at IS NOT NULL
                         THEN 'cancelled by request; fylr ' || q.claimed_by || ' stopped heartbeating before confirming it'
                         WHEN q.attempts < q.max_attempts THEN q.error
                         ELSE 'fylr ' || q.claimed_by || ' stopped heartbeating during the last attempt' END,
      updated_at  = now(),
      events      = q.events + 1
  FROM stale
  WHERE q.id = stale.id AND q.state IN ('claimed', 'running') AND q.claimed_by = stale.owner
  RETURNING q.id, q.state, stale.owner AS claimed_by, q.events, q.attempts
), ${eventCtes("orphan_events", 
  eventSelect({
    item: "id",
    n: "events",
    kind: "CASE WHEN state = 'queued' THEN 'requeued' ELSE state END",
    fylr: "$2::text",
    attempt: "attempts",
    detail: "'rescued: fylr ' || claimed_by || ' stopped heartbeating'",
    from: "orphans",
  }),
)}
SELECT
  (SELECT coalesce(json_agg(id), '[]'::json) FROM dead) AS dead,
  (SELECT coalesce(json_agg(json_build_object('id', id, 'state', state, 'claimedBy', claimed_by)), '[]'::json) FROM orphans) AS orphans`;

/**
 * Where an item stands: its state and, while queued, how many queued items of its kind
 * would be claimed before it. More urgent items (eligible by the time this one is) come
 * first; then, at its priority: for a local item, the items earlier in claim order; for
 * an exec item, the items of its own key before it plus, for each other key with items
 * due, the turns that key gets until this item's: min(its items, ceil((rank + 1) × its
 * weight / this weight)), rank being this item's place in its key. Index range scans on
 * the claim indexes, no scan of finished rows. $1 id.
 */
export const itemPosition = `
SELECT i.state, i.kind,
  CASE WHEN i.state <> 'queued' THEN 0
  ELSE
      (SELECT count(*) FROM queue_items q
       WHERE q.state = 'queued' AND q.kind = i.kind AND q.priority > i.priority
         AND q.start_after <= greatest(now(), i.start_after))
    + CASE WHEN i.kind = 'local' THEN
        (SELECT count(*) FROM queue_items q
         WHERE q.state = 'queued' AND q.kind = i.kind AND q.priority = i.priority
           AND (q.start_after, q.seq) < (i.start_after, i.seq))
      ELSE
        r.rank + (SELECT coalesce(sum(least(k.n, ceil((r.rank + 1) * k.w / i.fairness_weight::numeric))), 0)
                  FROM (SELECT count(*) AS n, max(q.fairness_weight) AS w FROM queue_items q
                        WHERE q.state = 'queued' AND q.kind = 'exec' AND q.priority = i.priority
                          AND q.fairness_key <> i.fairness_key AND q.start_after <= greatest(now(), i.start_after)
                        GROUP BY q.fairness_key) k)
      END
  END AS ahead
FROM queue_items i
CROSS JOIN LATERAL (
  SELECT count(*) AS rank FROM queue_items q
  WHERE q.state = 'queued' AND q.kind = i.kind AND q.priority = i.priority AND q.fairness_key = i.fairness_key
    AND (q.start_after, q.seq) < (i.start_after, i.seq)
) r
WHERE i.id = $1`;

/**
 * An item's timeline: one row per kept event, oldest first, each with the item's event
 * total (`total`); one row of nulls but `total` for an item without events; no row for an
 * unknown item. $1 id. The primary key's index serves it. By time, then number: a call's
 * events are written when the attempt settles, after the 'running' mark written while
 * the call ran.
 */
export const selectItemEvents = `
SELECT q.events AS total, e.n, e.at, e.kind, e.fylr, e.attempt, e.execserver, e.service, e.slot_wait_ms,
       e.duration_ms, e.exit_code, e.error_kind, e.detail
FROM queue_items q LEFT JOIN item_events e ON e.item_id = q.id
WHERE q.id = $1
ORDER BY e.at, e.n`;

/** Unfinished items by kind and state, for status pages. */
export const countOpen = `
SELECT kind, state, count(*)::int AS n FROM queue_items
WHERE state IN ('queued', 'claimed', 'running')
GROUP BY kind, state`;

/** Live fylrs and how many items each holds. */
export const listFylrs = `
SELECT f.id, f.hostname, f.pid, f.api_url, f.started_at, f.heartbeat_at,
       (SELECT count(*)::int FROM queue_items q WHERE q.claimed_by = f.id AND q.state IN ('claimed', 'running')) AS held
FROM fylrs f ORDER BY f.started_at`;

/**
 * Open items (queued, claimed, running) of all fylrs, by kind, state and priority, for the
 * status page. Stays on indexes however many finished rows the table keeps: queued rows
 * come from the claim index (index-only), held rows from the held-items index (bounded by
 * the fylrs' admission).
 */
export const openItemsByPriority = `
SELECT kind, state, priority, count(*)::int AS n FROM (
  SELECT kind, 'queued' AS state, priority FROM queue_items WHERE state = 'queued'
  UNION ALL
  SELECT kind, state, priority FROM queue_items WHERE state IN ('claimed', 'running')
) AS open_items
GROUP BY kind, state, priority`;

/**
 * Fairness keys with open items, most queued first, at most $1; and how many keys have
 * queued items in all. Queued rows come from the key claim index, held rows from the
 * per-key held index: no scan of finished rows.
 */
export const keyCounts = `
WITH open_keys AS (
  SELECT fairness_key, count(*)::int AS queued, 0 AS held, min(created_at) AS oldest
  FROM queue_items WHERE state = 'queued' GROUP BY fairness_key
  UNION ALL
  SELECT fairness_key, 0, count(*)::int, NULL FROM queue_items WHERE state IN ('claimed', 'running') GROUP BY fairness_key
), per_key AS (
  SELECT fairness_key, sum(queued)::int AS queued, sum(held)::int AS held, min(oldest) AS oldest
  FROM open_keys GROUP BY fairness_key
)
SELECT fairness_key, queued, held, oldest, (SELECT count(*)::int FROM per_key WHERE queued > 0) AS keys_queued
FROM per_key ORDER BY queued DESC, held DESC, fairness_key LIMIT $1`;

/** Keys with a claim turn (exec items queued, or a row not yet removed): the active-keys gauge. */
export const countKeyTurns = `SELECT count(DISTINCT fairness_key)::int AS n FROM queue_keys`;

/** Some items by id ($1 uuid[]), summarised for the status page, the error cut to one line's worth. */
export const itemSummariesById = `
SELECT id, kind, priority, fairness_key, state, attempts, claimed_by, updated_at, left(error, 240) AS error
FROM queue_items WHERE id = ANY($1::uuid[])`;

/**
 * Deletes up to $2 finished rows that finished more than $1 ms ago, oldest first: an index
 * range scan of queue_items_finished_idx (migration 0011), then one primary-key lookup per
 * row (an array, so no plan joins the whole table). Rows another sweeper holds are
 * skipped, so two fylrs sweeping at once delete each row once. Stored data of the rows goes
 * with them (ON DELETE CASCADE); returns how many rows, blobs and stored bytes went.
 */
export const sweepFinishedItems = `
WITH due AS (
  SELECT id FROM queue_items
  WHERE state IN ('succeeded', 'failed', 'cancelled')
    AND finished_at < now() - $1::double precision * interval '1 millisecond'
  ORDER BY finished_at
  LIMIT $2
  FOR UPDATE SKIP LOCKED
), gone AS (
  DELETE FROM queue_items WHERE id = ANY (ARRAY (SELECT id FROM due)) RETURNING id
)
SELECT (SELECT count(*) FROM gone)::int AS items, count(*)::int AS blobs, coalesce(sum(size), 0)::bigint AS bytes
FROM blobs WHERE item_id = ANY (ARRAY (SELECT id FROM gone))`;
