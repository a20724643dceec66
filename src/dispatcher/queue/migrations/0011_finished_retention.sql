-- 0011: finished item rows are deleted after the queue's retention (queue.retention).
--
-- The sweep takes the oldest finished rows first, a bounded batch per statement: an index
-- range scan over this index, which holds finished rows only, so it never reads the
-- backlog or the rows still in flight. Deleting a row deletes its stored inputs and
-- outputs with it (blobs.item_id is ON DELETE CASCADE); the store's usage counter follows
-- through the blob triggers of 0008.
--
-- Building the index reads the whole table once, under a lock that holds writes back
-- while it is built (seconds on a table of a million rows).

CREATE INDEX queue_items_finished_idx ON queue_items (finished_at)
  WHERE state IN ('succeeded', 'failed', 'cancelled');
