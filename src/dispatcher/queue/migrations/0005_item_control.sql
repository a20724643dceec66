-- 0005: control over items — cancel, list, retry, delete.
--
-- A new final state 'cancelled'. A queued or claimed item is cancelled at once. A running
-- item first gets `cancel_requested_at`: its fylr stops the job at the execserver and
-- writes 'cancelled' when the job's DONE arrives; any fylr writes it after the cancel
-- bound if that never happens. Every write that would put the item back in the queue (a
-- failed attempt, a release, the stale-claim rescue) turns into 'cancelled' instead once
-- a cancel was asked for.

ALTER TABLE queue_items DROP CONSTRAINT queue_items_state_check;
ALTER TABLE queue_items ADD CONSTRAINT queue_items_state_check
  CHECK (state IN ('queued', 'claimed', 'running', 'succeeded', 'failed', 'cancelled'));

ALTER TABLE queue_items ADD COLUMN cancel_requested_at timestamptz;

-- List: newest first is submission order backwards, paged by keyset on seq (no OFFSET).
-- One index for the unfiltered listing, one per common filter so a filtered page is an
-- index range scan too: by state, and by service (the first call's, or the local action's
-- name: the expression the list query filters on).
CREATE INDEX queue_items_list_idx ON queue_items (seq DESC);
CREATE INDEX queue_items_list_state_idx ON queue_items (state, seq DESC);
CREATE INDEX queue_items_list_service_idx
  ON queue_items ((coalesce(payload -> 'calls' -> 0 ->> 'service', payload -> 'local' ->> 'name')), seq DESC);

-- Held items with a cancel pending: the bound sweep and the holder's check.
CREATE INDEX queue_items_cancel_idx ON queue_items (cancel_requested_at)
  WHERE cancel_requested_at IS NOT NULL AND state IN ('claimed', 'running');
