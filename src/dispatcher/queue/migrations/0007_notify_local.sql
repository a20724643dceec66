-- 0007: a second notification, "queued local", when a local item became queued.
--
-- "queued" still goes out for every statement that queued an item, exactly as in 0002, so
-- fylrs of earlier versions keep working unchanged. "queued local" goes out besides when
-- one of those items is local. A fylr that knows this asks Postgres for local items only
-- after one (or its poll): before, every claim pass woken by a queued exec item ran the
-- local claim statement too, and found nothing.

CREATE OR REPLACE FUNCTION slotbroker_notify_queue() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
  ids text;
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
  IF EXISTS (
    SELECT 1 FROM new_rows n JOIN old_rows o USING (id) WHERE n.state = 'queued' AND o.state <> 'queued'
  ) THEN
    PERFORM pg_notify('slotbroker_queue', 'queued');
    IF EXISTS (
      SELECT 1 FROM new_rows n JOIN old_rows o USING (id) WHERE n.state = 'queued' AND o.state <> 'queued' AND n.kind = 'local'
    ) THEN
      PERFORM pg_notify('slotbroker_queue', 'queued local');
    END IF;
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
