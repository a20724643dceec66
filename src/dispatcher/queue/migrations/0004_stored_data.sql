-- 0004: stored inputs and outputs of any size, in the queue's own database.
--
-- blobs: one row per stored byte sequence (an uploaded input, an item's output, the
-- stdout between two chained calls). Its bytes are in blob_chunks, in fixed-size chunks
-- (the last one shorter), so a byte range maps to a range of chunk rows.
--
-- A blob is written in one transaction: a cut-off upload or a fylr that dies mid-write
-- leaves no row at all (Postgres rolls the transaction back when the connection drops).
-- A committed blob nobody adopted yet (an upload not submitted, an output whose item has
-- not completed) carries `expires_at` and is deleted after it. Adopting it (Submit takes
-- an upload; completion records an output) clears `expires_at`. Adopted blobs are deleted
-- with their item (ON DELETE CASCADE) or once their item has been finished for longer
-- than the configured retention: `item_finished_at` mirrors the item's finished_at
-- (trigger below), so the retention sweep is an index range scan.

CREATE TABLE blobs (
  id               uuid PRIMARY KEY DEFAULT gen_random_uuid(),
  item_id          uuid REFERENCES queue_items (id) ON DELETE CASCADE,
  role             text NOT NULL CHECK (role IN ('input', 'output', 'intermediate')),
  size             bigint NOT NULL CHECK (size >= 0),
  sha256           text NOT NULL,
  chunk_bytes      integer NOT NULL CHECK (chunk_bytes > 0),
  created_by       text,
  created_at       timestamptz NOT NULL DEFAULT now(),
  expires_at       timestamptz,
  item_finished_at timestamptz
);

CREATE TABLE blob_chunks (
  blob_id uuid NOT NULL REFERENCES blobs (id) ON DELETE CASCADE,
  seq     integer NOT NULL CHECK (seq >= 0),
  data    bytea NOT NULL,
  PRIMARY KEY (blob_id, seq)
);

CREATE INDEX blobs_item_idx ON blobs (item_id) WHERE item_id IS NOT NULL;
CREATE INDEX blobs_expires_idx ON blobs (expires_at) WHERE expires_at IS NOT NULL;
CREATE INDEX blobs_finished_idx ON blobs (item_finished_at) WHERE item_finished_at IS NOT NULL;

-- The item's stored output (NULL when the whole output is in `output`), its size and
-- digest. `output` keeps the first bytes of a stored output for quick display.
ALTER TABLE queue_items
  ADD COLUMN output_blob   uuid,
  ADD COLUMN output_size   bigint,
  ADD COLUMN output_sha256 text;

-- Keeps blobs in step with their item, whichever statement changes it (completion, a
-- failed last attempt, a rescue, a retry or cancel added later): a recorded output is
-- adopted, and every adopted blob of the item learns when the item finished (or that it
-- runs again).
CREATE OR REPLACE FUNCTION slotbroker_item_blobs() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF NEW.output_blob IS NOT NULL AND NEW.output_blob IS DISTINCT FROM OLD.output_blob THEN
    UPDATE blobs SET expires_at = NULL WHERE id = NEW.output_blob AND item_id = NEW.id;
  END IF;
  IF NEW.finished_at IS DISTINCT FROM OLD.finished_at THEN
    UPDATE blobs SET item_finished_at = NEW.finished_at WHERE item_id = NEW.id AND expires_at IS NULL;
  END IF;
  RETURN NULL;
END
$$;

CREATE TRIGGER queue_items_blobs AFTER UPDATE OF output_blob, finished_at ON queue_items
  FOR EACH ROW WHEN (NEW.output_blob IS DISTINCT FROM OLD.output_blob OR NEW.finished_at IS DISTINCT FROM OLD.finished_at)
  EXECUTE FUNCTION slotbroker_item_blobs();
