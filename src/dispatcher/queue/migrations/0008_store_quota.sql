-- 0008: the store's quota counts writes in progress, across every fylr of the queue.
--
-- A write reserves the bytes it is about to store before it stores them, in a short
-- transaction of its own, so every other fylr sees the reservation at once; the bytes of
-- a write that is rolled back (cut off, refused, its fylr died) were never stored, so they
-- never counted before. `blob_usage` is one row: the bytes of committed blobs (kept by the
-- triggers below) — the rows a reservation locks, so reservations are decided one at a
-- time. `blob_reservations` holds one row per write in progress: deleted in the write's
-- own commit (the bytes move to `stored` in the same transaction), right after a write
-- failed, or by any fylr once the writer's fylr is gone from `fylrs` (the stale-heartbeat
-- sweep removed it).

-- No blob may be written while the count starts: a write still open would commit its size
-- after the sum below and before the triggers exist.
LOCK TABLE blobs IN SHARE MODE;

CREATE TABLE blob_usage (
  singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
  stored    bigint NOT NULL CHECK (stored >= 0)
);
INSERT INTO blob_usage (stored) SELECT coalesce(sum(size), 0) FROM blobs;

CREATE TABLE blob_reservations (
  id         uuid PRIMARY KEY,
  fylr_id    text,
  bytes      bigint NOT NULL CHECK (bytes >= 0),
  created_at timestamptz NOT NULL DEFAULT now()
);

-- Deferred to the commit: the counter row is locked last and only for the commit itself,
-- so no transaction holds it while it waits for a blob row another one holds. A new blob
-- row (size 0 until its write ends) touches it not at all.
CREATE OR REPLACE FUNCTION slotbroker_blob_usage() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF TG_OP = 'TRUNCATE' THEN
    UPDATE blob_usage SET stored = 0;
  ELSIF TG_OP = 'INSERT' THEN
    UPDATE blob_usage SET stored = stored + NEW.size;
  ELSIF TG_OP = 'DELETE' THEN
    UPDATE blob_usage SET stored = stored - OLD.size;
  ELSE
    UPDATE blob_usage SET stored = stored + NEW.size - OLD.size;
  END IF;
  RETURN NULL;
END
$$;

CREATE CONSTRAINT TRIGGER blobs_usage_insert AFTER INSERT ON blobs DEFERRABLE INITIALLY DEFERRED
  FOR EACH ROW WHEN (NEW.size <> 0) EXECUTE FUNCTION slotbroker_blob_usage();
CREATE CONSTRAINT TRIGGER blobs_usage_delete AFTER DELETE ON blobs DEFERRABLE INITIALLY DEFERRED
  FOR EACH ROW WHEN (OLD.size <> 0) EXECUTE FUNCTION slotbroker_blob_usage();
CREATE CONSTRAINT TRIGGER blobs_usage_update AFTER UPDATE OF size ON blobs DEFERRABLE INITIALLY DEFERRED
  FOR EACH ROW WHEN (NEW.size <> OLD.size) EXECUTE FUNCTION slotbroker_blob_usage();
CREATE TRIGGER blobs_usage_truncate AFTER TRUNCATE ON blobs
  FOR EACH STATEMENT EXECUTE FUNCTION slotbroker_blob_usage();

-- Sets write p_id's reservation to p_want bytes in all, or to as much as fits when that is
-- at least p_least; returns the bytes now reserved (NULL: refused), the committed bytes
-- and the other writes' reservations it was decided against. p_limit 0: no limit. The
-- lock on blob_usage makes concurrent reservations wait for each other; each statement
-- after it sees what the one before committed (a volatile function takes a new snapshot
-- per statement).
CREATE OR REPLACE FUNCTION slotbroker_reserve_blob(p_id uuid, p_fylr text, p_want bigint, p_least bigint, p_limit bigint)
RETURNS TABLE (granted bigint, stored bigint, reserved bigint) LANGUAGE plpgsql VOLATILE AS $$
DECLARE
  s bigint;
  r bigint;
  g bigint;
BEGIN
  SELECT u.stored INTO s FROM blob_usage u FOR UPDATE;
  SELECT coalesce(sum(b.bytes), 0) INTO r FROM blob_reservations b WHERE b.id <> p_id;
  g := CASE WHEN p_limit <= 0 THEN p_want ELSE least(p_want, p_limit - s - r) END;
  IF g < p_least THEN
    RETURN QUERY SELECT NULL::bigint, s, r;
    RETURN;
  END IF;
  INSERT INTO blob_reservations (id, fylr_id, bytes) VALUES (p_id, p_fylr, g)
    ON CONFLICT (id) DO UPDATE SET bytes = EXCLUDED.bytes;
  RETURN QUERY SELECT g, s, r;
END
$$;
