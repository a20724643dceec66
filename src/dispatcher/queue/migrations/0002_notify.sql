-- 0002: wakeups by LISTEN/NOTIFY on the channel "slotbroker_queue".
--
-- One notification per statement, never per row (a claim or a batch of completions is one
-- statement, and every notifying transaction takes the notify queue's lock at commit):
--   "queued"              some row became queued: a submit, a retry, a requeue, a sweep.
--                         Every fylr's claim loop wakes up.
--   "changed <id>,<id>…"  these rows changed state (at most 100 ids per notification).
--                         Watch streams of those items wake up.
-- The dispatcher's poll stays as the safety net: a notification can be missed while a
-- listener reconnects.
--
-- The function is created OR REPLACEd: it outlives its table, so a database whose tables
-- (and migration ledger) were dropped, as tests do to start afresh, migrates again.

CREATE OR REPLACE FUNCTION slotbroker_notify_queue() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
  ids text;
BEGIN
  IF TG_OP = 'INSERT' THEN
    IF EXISTS (SELECT 1 FROM new_rows WHERE state = 'queued') THEN
      PERFORM pg_notify('slotbroker_queue', 'queued');
    END IF;
    RETURN NULL;
  END IF;
  IF EXISTS (
    SELECT 1 FROM new_rows n JOIN old_rows o USING (id) WHERE n.state = 'queued' AND o.state <> 'queued'
  ) THEN
    PERFORM pg_notify('slotbroker_queue', 'queued');
  END IF;
  FOR ids IN
    SELECT string_agg(id::text, ',') FROM (
      SELECT n.id, (row_number() OVER () - 1) / 100 AS chunk
      FROM new_rows n JOIN old_rows o USING (id) WHERE n.state <> o.state
    ) changed GROUP BY chunk
  LOOP
    PERFORM pg_notify('slotbroker_queue', 'changed ' || ids);
  END LOOP;
  RETURN NULL;
END
$$;

CREATE TRIGGER queue_items_notify_insert AFTER INSERT ON queue_items
  REFERENCING NEW TABLE AS new_rows
  FOR EACH STATEMENT EXECUTE FUNCTION slotbroker_notify_queue();

CREATE TRIGGER queue_items_notify_update AFTER UPDATE ON queue_items
  REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
  FOR EACH STATEMENT EXECUTE FUNCTION slotbroker_notify_queue();
