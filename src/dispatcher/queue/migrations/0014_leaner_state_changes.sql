-- 0014: fewer writes per state change.
--
-- No update of queue_items can be HOT (`state` is in the claim and list indexes), so every
-- state change writes an entry into each index whose predicate the new row version meets,
-- and every event row checked its item with a row lock (the foreign key). Three go:
--
-- queue_items_list_idx (seq DESC): the unfiltered listing merges the per-state ranges of
-- queue_items_list_state_idx instead (item-list.ts), one range per state, already in page
-- order. Listings of earlier fylrs that filter by nothing sort instead until they are
-- upgraded.
--
-- queue_items_held_idx (claimed_by over held rows): the held rows are as few as the fleet's
-- places, and queue_items_key_held_idx covers the same rows; the sweep and the per-fylr
-- counts read them all through it.
--
-- The foreign key of item_events: events are only written beside the write of their item
-- (event-sql.ts), which holds the item's row. Deleting items deletes their events through
-- the statement trigger below, once per statement instead of once per row.

DROP INDEX queue_items_list_idx;
DROP INDEX queue_items_held_idx;

ALTER TABLE item_events DROP CONSTRAINT item_events_item_id_fkey;

CREATE OR REPLACE FUNCTION slotbroker_drop_item_events() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF TG_OP = 'TRUNCATE' THEN
    TRUNCATE item_events;
  ELSE
    DELETE FROM item_events WHERE item_id = ANY (ARRAY (SELECT id FROM old_rows));
  END IF;
  RETURN NULL;
END
$$;

CREATE TRIGGER queue_items_events_delete AFTER DELETE ON queue_items
  REFERENCING OLD TABLE AS old_rows
  FOR EACH STATEMENT EXECUTE FUNCTION slotbroker_drop_item_events();
CREATE TRIGGER queue_items_events_truncate AFTER TRUNCATE ON queue_items
  FOR EACH STATEMENT EXECUTE FUNCTION slotbroker_drop_item_events();
