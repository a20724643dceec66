-- 0012: the trace an item belongs to.
--
-- The W3C traceparent of the item's Submit span when its fylr records traces (else null):
-- the fylr that claims the item, on any attempt, continues that trace. Adding a nullable
-- column without a default rewrites nothing.

ALTER TABLE queue_items ADD COLUMN traceparent text;
