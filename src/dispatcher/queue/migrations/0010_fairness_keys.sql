-- 0010: fairness keys. Every item carries a key (a tenant, a user; '' is the default key), a
-- weight and, optionally, a limit on how many items of its key may be held at once across
-- the fleet. Exec claims take keys in turn within a priority — weighted round-robin, oldest
-- first within a key — instead of the oldest item overall.
--
-- The turn is stride scheduling over `queue_keys`, one row per (kind, priority, key) with
-- queued items: a claim serves the ready key with the lowest `pass` and advances it by
-- 1/weight per item taken (slotbroker_claim_exec below). A key that joins (its first queued
-- item, or its first after idling) starts at the lowest pass of its priority, so it never
-- banks credit. A key row without queued items is removed by the next claim that passes it.

ALTER TABLE queue_items ADD COLUMN fairness_key text NOT NULL DEFAULT '';
ALTER TABLE queue_items ADD COLUMN fairness_weight integer NOT NULL DEFAULT 1
  CHECK (fairness_weight BETWEEN 1 AND 1000);
ALTER TABLE queue_items ADD COLUMN fairness_limit integer CHECK (fairness_limit >= 1);

-- The oldest queued item of one key at one priority: the claim's pick within a key and its
-- "is this key ready" probe, in today's order (eligibility time, then submission).
CREATE INDEX queue_items_key_claim_idx ON queue_items (kind, priority, fairness_key, start_after, seq)
  WHERE state = 'queued';
-- Held items of a key: the per-key limit's count.
CREATE INDEX queue_items_key_held_idx ON queue_items (fairness_key)
  WHERE state IN ('claimed', 'running');
-- List filtered by key, newest first.
CREATE INDEX queue_items_list_key_idx ON queue_items (fairness_key, seq DESC);

CREATE TABLE queue_keys (
  kind         text NOT NULL,
  priority     integer NOT NULL,
  fairness_key text NOT NULL,
  -- Virtual time: items served so far, each counted 1/weight.
  pass         double precision NOT NULL,
  PRIMARY KEY (kind, priority, fairness_key)
);
CREATE INDEX queue_keys_turn_idx ON queue_keys (kind, priority DESC, pass, fairness_key);

-- The advisory lock that orders "a key row is created for a newly queued item" against "a
-- claim removes a key row it found without queued items": the trigger holds it shared, the
-- remover must get it exclusively without waiting. Keys share 64 locks (a collision only
-- postpones a removal), so a transaction queuing items of many keys holds at most 64.
CREATE OR REPLACE FUNCTION slotbroker_key_lock(kind text, priority integer, fairness_key text) RETURNS integer
LANGUAGE sql IMMUTABLE AS $$ SELECT hashtext(kind || '/' || priority::text || '/' || fairness_key) & 63 $$;

-- Every item that becomes queued (insert, retry, requeue, rescue) makes sure its key has a row.
CREATE OR REPLACE FUNCTION slotbroker_queue_key() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  PERFORM pg_advisory_xact_lock_shared(902609, slotbroker_key_lock(NEW.kind, NEW.priority, NEW.fairness_key));
  IF NOT EXISTS (SELECT 1 FROM queue_keys WHERE kind = NEW.kind AND priority = NEW.priority AND fairness_key = NEW.fairness_key) THEN
    INSERT INTO queue_keys (kind, priority, fairness_key, pass)
    VALUES (NEW.kind, NEW.priority, NEW.fairness_key,
            coalesce((SELECT min(pass) FROM queue_keys WHERE kind = NEW.kind AND priority = NEW.priority), 0))
    ON CONFLICT DO NOTHING;
  END IF;
  RETURN NULL;
END $$;

CREATE TRIGGER queue_items_key_insert AFTER INSERT ON queue_items
  FOR EACH ROW WHEN (NEW.state = 'queued' AND NEW.kind = 'exec') EXECUTE FUNCTION slotbroker_queue_key();
CREATE TRIGGER queue_items_key_requeue AFTER UPDATE OF state ON queue_items
  FOR EACH ROW WHEN (NEW.state = 'queued' AND OLD.state <> 'queued' AND NEW.kind = 'exec') EXECUTE FUNCTION slotbroker_queue_key();

INSERT INTO queue_keys (kind, priority, fairness_key, pass)
SELECT DISTINCT kind, priority, fairness_key, 0::double precision FROM queue_items WHERE state = 'queued' AND kind = 'exec';

-- Claims up to p_limit queued exec items with priority ≥ p_min_priority for fylr p_fylr, in
-- claim order: priority, then keys in turn, then oldest first within a key. A fylr without a
-- row (declared dead) claims nothing.
--
-- Each round picks the key with the lowest pass among those with an eligible item and room
-- under its limit, takes as many of its oldest items as its turn allows before the next key's
-- (all it may when it is the only key), and advances its pass. Keys passed over for having
-- nothing eligible or no room are moved up to the served key's pass: a key cannot bank turns
-- while it has nothing to run. Concurrent claimers: the first key row is locked waiting (so
-- two fylrs on one key take turns instead of one seeing it empty), later ones SKIP LOCKED
-- (another claimer is taking that key's turn); the only key of a priority is served without
-- its row (no turn to keep). Items are taken SKIP LOCKED as before, so no item is claimed
-- twice. A key's limit counts its held exec items under an advisory lock of
-- the key, taken without waiting: a key another claimer is counting is passed over.
CREATE OR REPLACE FUNCTION slotbroker_claim_exec(p_fylr text, p_min_priority integer, p_limit integer)
RETURNS SETOF queue_items LANGUAGE plpgsql AS $$
DECLARE
  left_to_take integer := p_limit;
  k record;
  chosen record;
  have_chosen boolean;
  chosen_weight integer;
  nxt double precision;
  nxt_key text;
  turns double precision;
  locked_one boolean := false;
  busy text[] := '{}';
  take integer;
  held integer;
  got integer;
  spent double precision;
  r queue_items%ROWTYPE;
  passed_over text[];
  rounds integer := 0;
  scan_priority integer;
BEGIN
  IF p_limit < 0 THEN
    RAISE EXCEPTION 'LIMIT must not be negative' USING ERRCODE = '2201W';
  END IF;
  IF p_limit = 0 OR NOT EXISTS (SELECT 1 FROM fylrs WHERE id = p_fylr) THEN
    RETURN;
  END IF;
  WHILE left_to_take > 0 AND rounds < 4 * p_limit + 16 LOOP
    rounds := rounds + 1;
    have_chosen := false;
    nxt := NULL;
    nxt_key := NULL;
    passed_over := '{}';
    scan_priority := NULL;
    -- Each key row with its oldest queued item (read as the scan reaches the row).
    FOR k IN
      SELECT qk.priority, qk.fairness_key, qk.pass, f.ready, f.fairness_weight, f.fairness_limit
      FROM queue_keys qk
      LEFT JOIN LATERAL (
        SELECT q.start_after <= now() AS ready, q.fairness_weight, q.fairness_limit
        FROM queue_items q
        WHERE q.state = 'queued' AND q.kind = 'exec' AND q.priority = qk.priority AND q.fairness_key = qk.fairness_key
        ORDER BY q.start_after, q.seq LIMIT 1
      ) f ON true
      WHERE qk.kind = 'exec' AND qk.priority >= p_min_priority
      ORDER BY qk.priority DESC, qk.pass, qk.fairness_key
    LOOP
      IF have_chosen THEN
        -- The next key at the chosen priority bounds the chosen key's turn.
        IF k.priority = chosen.priority THEN nxt := k.pass; nxt_key := k.fairness_key; END IF;
        EXIT;
      END IF;
      IF k.priority IS DISTINCT FROM scan_priority THEN
        scan_priority := k.priority;
        passed_over := '{}';
      END IF;
      IF (k.priority::text || '/' || k.fairness_key) = ANY(busy) THEN
        CONTINUE;
      END IF;
      IF k.ready IS NULL THEN
        -- Idle: drop the row unless an item of the key is being queued right now or another
        -- claimer holds it; a row that stays is moved up like a key with nothing eligible.
        IF pg_try_advisory_xact_lock(902609, slotbroker_key_lock('exec', k.priority, k.fairness_key)) THEN
          DELETE FROM queue_keys qk
          USING (SELECT fairness_key FROM queue_keys
                 WHERE kind = 'exec' AND priority = k.priority AND fairness_key = k.fairness_key
                 FOR UPDATE SKIP LOCKED) idle
          WHERE qk.kind = 'exec' AND qk.priority = k.priority AND qk.fairness_key = idle.fairness_key
            AND NOT EXISTS (SELECT 1 FROM queue_items q WHERE q.state = 'queued' AND q.kind = 'exec'
                            AND q.priority = k.priority AND q.fairness_key = k.fairness_key);
          IF FOUND THEN CONTINUE; END IF;
        END IF;
        passed_over := passed_over || k.fairness_key;
        CONTINUE;
      END IF;
      IF NOT k.ready THEN
        passed_over := passed_over || k.fairness_key;
        CONTINUE;
      END IF;
      take := left_to_take;
      IF k.fairness_limit IS NOT NULL THEN
        IF NOT pg_try_advisory_xact_lock(902610, hashtext(k.fairness_key)) THEN
          passed_over := passed_over || k.fairness_key;
          CONTINUE;
        END IF;
        SELECT count(*) INTO held FROM queue_items q
        WHERE q.fairness_key = k.fairness_key AND q.state IN ('claimed', 'running') AND q.kind = 'exec';
        IF held >= k.fairness_limit THEN
          passed_over := passed_over || k.fairness_key;
          CONTINUE;
        END IF;
        take := least(take, k.fairness_limit - held);
      END IF;
      chosen := k;
      have_chosen := true;
      chosen_weight := k.fairness_weight;
    END LOOP;
    EXIT WHEN NOT have_chosen;
    -- The only key of its priority takes its items oldest first, as if there were no keys:
    -- no turn to keep, so no key row to lock or advance (concurrent claimers take disjoint
    -- items SKIP LOCKED, as before keys). A key that joins starts at this key's pass.
    IF nxt IS NOT NULL THEN
      IF locked_one THEN
        PERFORM 1 FROM queue_keys qk
        WHERE qk.kind = 'exec' AND qk.priority = chosen.priority AND qk.fairness_key = chosen.fairness_key
        FOR UPDATE SKIP LOCKED;
        IF NOT FOUND THEN
          -- Another claimer is serving this key's turn now: pick among the others.
          busy := busy || (chosen.priority::text || '/' || chosen.fairness_key);
          CONTINUE;
        END IF;
      ELSE
        PERFORM 1 FROM queue_keys qk
        WHERE qk.kind = 'exec' AND qk.priority = chosen.priority AND qk.fairness_key = chosen.fairness_key
        FOR UPDATE;
        locked_one := true;
      END IF;
      -- Another claimer may have served this key since the scan began: pick again.
      IF NOT EXISTS (SELECT 1 FROM queue_keys qk WHERE qk.kind = 'exec' AND qk.priority = chosen.priority
                     AND qk.fairness_key = chosen.fairness_key AND qk.pass = chosen.pass) THEN
        CONTINUE;
      END IF;
    END IF;
    IF nxt IS NOT NULL THEN
      -- Items whose start pass (pass + i/weight) comes before the next key's; on a tie the
      -- key that sorts first goes first. Snapped so that 3 × (1/3) counts as 1.
      turns := (nxt - chosen.pass) * chosen_weight;
      IF abs(turns - round(turns)) < 1e-9 THEN turns := round(turns); END IF;
      take := least(take, greatest(1, CASE WHEN chosen.fairness_key < nxt_key THEN floor(turns)::integer + 1
                                           ELSE ceil(turns)::integer END));
    END IF;
    IF nxt IS NULL AND cardinality(passed_over) = 0 THEN
      -- No turn to keep: return the claimed rows as they come.
      RETURN QUERY
      WITH next AS (
        SELECT q.id FROM queue_items q
        WHERE q.state = 'queued' AND q.kind = 'exec' AND q.priority = chosen.priority
          AND q.fairness_key = chosen.fairness_key AND q.start_after <= now()
        ORDER BY q.start_after, q.seq
        LIMIT take
        FOR UPDATE SKIP LOCKED
      ), claimed AS (
        UPDATE queue_items q
        SET state = 'claimed', claimed_by = p_fylr, lease = q.lease + 1, attempts = q.attempts + 1,
            claimed_at = now(), updated_at = now(), events = q.events + 1
        FROM next
        WHERE q.id = next.id
        RETURNING q.*
      )
      SELECT * FROM claimed ORDER BY start_after, seq;
      GET DIAGNOSTICS got = ROW_COUNT;
      EXIT WHEN got = 0;
      left_to_take := left_to_take - got;
      CONTINUE;
    END IF;
    spent := 0;
    FOR r IN
      WITH next AS (
        SELECT q.id FROM queue_items q
        WHERE q.state = 'queued' AND q.kind = 'exec' AND q.priority = chosen.priority
          AND q.fairness_key = chosen.fairness_key AND q.start_after <= now()
        ORDER BY q.start_after, q.seq
        LIMIT take
        FOR UPDATE SKIP LOCKED
      ), claimed AS (
        UPDATE queue_items q
        SET state = 'claimed', claimed_by = p_fylr, lease = q.lease + 1, attempts = q.attempts + 1,
            claimed_at = now(), updated_at = now(), events = q.events + 1
        FROM next
        WHERE q.id = next.id
        RETURNING q.*
      )
      SELECT * FROM claimed ORDER BY start_after, seq
    LOOP
      spent := spent + 1.0 / r.fairness_weight;
      left_to_take := left_to_take - 1;
      RETURN NEXT r;
    END LOOP;
    IF spent = 0 THEN
      -- Its eligible items are being claimed by others right now: not this round's key.
      passed_over := passed_over || chosen.fairness_key;
      EXIT;
    END IF;
    IF nxt IS NOT NULL THEN
      UPDATE queue_keys SET pass = pass + spent
      WHERE kind = 'exec' AND priority = chosen.priority AND fairness_key = chosen.fairness_key;
    END IF;
    IF cardinality(passed_over) > 0 THEN
      UPDATE queue_keys qk SET pass = chosen.pass
      FROM (SELECT fairness_key FROM queue_keys
            WHERE kind = 'exec' AND priority = chosen.priority AND fairness_key = ANY(passed_over) AND pass < chosen.pass
            FOR UPDATE SKIP LOCKED) moved
      WHERE qk.kind = 'exec' AND qk.priority = chosen.priority AND qk.fairness_key = moved.fairness_key;
    END IF;
  END LOOP;
  RETURN;
END $$;
