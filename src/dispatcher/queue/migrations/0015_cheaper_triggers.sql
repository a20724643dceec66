-- 0015: less trigger work per state change.
--
-- The blobs trigger (0004) ran for every item that finished or ran again: a PL/pgSQL call
-- and an UPDATE of blobs by item, although most items own no adopted blob. An item's
-- adopted blobs are its uploaded input (adopted at submit: its first call reads an upload)
-- and its recorded output (output_blob); an intermediate stdout is never adopted. So the
-- finish time goes to the blobs only for an item that has one of those.
--
-- The notify trigger (0002, 0007) read its transition tables with up to three queries per
-- UPDATE statement (a join for "queued", another for "queued local", a window for the
-- "changed" ids); one pass over the changed rows now gives all three. Same notifications,
-- still one per statement (the "changed" ids in chunks of 100).
--
-- On INSERT it kept a transition table and ran a PL/pgSQL call for every statement, also
-- for an item inserted already claimed, which notifies nothing. A row trigger on queued
-- rows says the same: Postgres delivers one of identical notifications of a transaction.

DROP TRIGGER queue_items_blobs ON queue_items;
CREATE TRIGGER queue_items_blobs AFTER UPDATE OF output_blob, finished_at ON queue_items
  FOR EACH ROW WHEN (
    NEW.output_blob IS DISTINCT FROM OLD.output_blob
    OR (NEW.finished_at IS DISTINCT FROM OLD.finished_at
        AND (NEW.output_blob IS NOT NULL OR (NEW.payload -> 'calls' -> 0 -> 'stdin') ? 'upload'))
  )
  EXECUTE FUNCTION slotbroker_item_blobs();

CREATE OR REPLACE FUNCTION slotbroker_notify_queue() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
  ids text;
  n integer;
  queued boolean;
  queued_local boolean;
BEGIN
  IF TG_OP = 'INSERT' THEN
    IF EXISTS (SELECT 1 FROM new_rows WHERE state = 'queued') THEN
      PERFORM pg_notify('slotbroker_queue', 'queued');
      IF EXISTS (SELECT 1 FROM new_rows WHERE state = 'queued' AND kind = 'local') THEN
        PERFORM pg_notify('slotbroker_queue', 'queued local');
      END IF;
    END IF;
    RETURN NULL;
  END IF;
  SELECT string_agg(nw.id::text, ','), count(*),
         bool_or(nw.state = 'queued'), bool_or(nw.state = 'queued' AND nw.kind = 'local')
  INTO ids, n, queued, queued_local
  FROM new_rows nw JOIN old_rows o USING (id) WHERE nw.state <> o.state;
  IF n = 0 THEN
    RETURN NULL;
  END IF;
  IF queued THEN
    PERFORM pg_notify('slotbroker_queue', 'queued');
    IF queued_local THEN
      PERFORM pg_notify('slotbroker_queue', 'queued local');
    END IF;
  END IF;
  IF n <= 100 THEN
    PERFORM pg_notify('slotbroker_queue', 'changed ' || ids);
  ELSE
    FOR ids IN
      SELECT string_agg(id::text, ',') FROM (
        SELECT nw.id, (row_number() OVER () - 1) / 100 AS chunk
        FROM new_rows nw JOIN old_rows o USING (id) WHERE nw.state <> o.state
      ) changed GROUP BY chunk
    LOOP
      PERFORM pg_notify('slotbroker_queue', 'changed ' || ids);
    END LOOP;
  END IF;
  RETURN NULL;
END
$$;

CREATE OR REPLACE FUNCTION slotbroker_notify_queued() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  PERFORM pg_notify('slotbroker_queue', 'queued');
  IF NEW.kind = 'local' THEN
    PERFORM pg_notify('slotbroker_queue', 'queued local');
  END IF;
  RETURN NULL;
END
$$;

DROP TRIGGER queue_items_notify_insert ON queue_items;
CREATE TRIGGER queue_items_notify_insert AFTER INSERT ON queue_items
  FOR EACH ROW WHEN (NEW.state = 'queued') EXECUTE FUNCTION slotbroker_notify_queued();
