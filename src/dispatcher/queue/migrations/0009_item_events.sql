-- 0009: an item's timeline — every change of its state, and each call's slot and job.
--
-- Events are written by the statements that change the item (a CTE beside the UPDATE or
-- INSERT), never by a round trip of their own. `queue_items.events` counts the events an
-- item ever had; the event numbered n goes to `slot` (n − 1) % 200, so an item keeps its
-- latest 200 events (an older one is overwritten in place, never deleted) and a reader
-- knows how many went before. Events go with their item (ON DELETE CASCADE).
--
-- Times are the database's now(), except a call's: its slot grant and its end are the
-- running fylr's clock (they happened before the write that records them).

ALTER TABLE queue_items ADD COLUMN events integer NOT NULL DEFAULT 0;

CREATE TABLE item_events (
  item_id      uuid NOT NULL REFERENCES queue_items (id) ON DELETE CASCADE,
  slot         integer NOT NULL CHECK (slot >= 0 AND slot < 200),
  -- The event's number in the item's history, from 1.
  n            integer NOT NULL CHECK (n >= 1),
  at           timestamptz NOT NULL,
  -- submitted, claimed, running, call-started, call-ended, requeued, cancel-requested,
  -- cancelled, retried, succeeded, failed.
  kind         text NOT NULL,
  -- The fylr that did it (claimed, ran, rescued); null for a request through the API.
  fylr         text,
  attempt      integer,
  execserver   text,
  service      text,
  slot_wait_ms double precision,
  duration_ms  double precision,
  exit_code    integer,
  -- A receipt's ErrorKind name, e.g. ERROR_KIND_TIMEOUT.
  error_kind   text,
  -- Why: the error, the requeue's reason; at most 240 characters.
  detail       text,
  PRIMARY KEY (item_id, slot)
);
