-- 0013: one exec claim query, planned once per connection.
--
-- slotbroker_claim_exec (0010) as before, with one claim statement where it had two alike
-- (the only key of a priority and a key taking its turn now share it: the turn's
-- bookkeeping after it does nothing for the former). Its statements use the plans cached
-- for the connection: with `LIMIT take` Postgres judged the cached plan costlier than one
-- made for the value at hand and planned the claim afresh on every call. The claimed rows
-- are updated by id (an array), so the cached plan never joins the whole table whatever
-- the limit.

CREATE OR REPLACE FUNCTION slotbroker_claim_exec(p_fylr text, p_min_priority integer, p_limit integer)
RETURNS SETOF queue_items LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan AS $$
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
        WHERE q.id = ANY (ARRAY (SELECT id FROM next))
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
