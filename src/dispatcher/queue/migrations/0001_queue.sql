-- 0001: the work queue and the registry of live fylrs.
--
-- queue_items: one row per submitted item. A row moves
--   queued → claimed (a fylr took it; waiting for a slot) → running → succeeded | failed,
-- and back to queued on retry, on "no slot in time" and when its owner's heartbeat went
-- stale. `lease` is bumped on every claim; every write by the owner is fenced by
-- (id, claimed_by, lease), so a late write from an earlier claim updates nothing.

CREATE TABLE fylrs (
  id           text PRIMARY KEY,
  hostname     text NOT NULL,
  pid          integer NOT NULL,
  api_url      text,
  version      text,
  started_at   timestamptz NOT NULL DEFAULT now(),
  heartbeat_at timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE queue_items (
  id              uuid PRIMARY KEY DEFAULT gen_random_uuid(),
  -- Submission order, the last tie-break of the claim order (uuids are random).
  seq             bigint GENERATED ALWAYS AS IDENTITY,
  kind            text NOT NULL CHECK (kind IN ('exec', 'local')),
  -- Larger is more urgent.
  priority        integer NOT NULL DEFAULT 0,
  -- The calls or the local action (inline bytes as base64).
  payload         jsonb NOT NULL,
  state           text NOT NULL DEFAULT 'queued'
                  CHECK (state IN ('queued', 'claimed', 'running', 'succeeded', 'failed')),
  -- The fylr holding the claim; kept after the item finished, for the record.
  claimed_by      text,
  lease           bigint NOT NULL DEFAULT 0,
  start_after     timestamptz NOT NULL DEFAULT now(),
  attempts        integer NOT NULL DEFAULT 0 CHECK (attempts >= 0),
  max_attempts    integer NOT NULL DEFAULT 3 CHECK (max_attempts >= 1),
  created_at      timestamptz NOT NULL DEFAULT now(),
  claimed_at      timestamptz,
  updated_at      timestamptz NOT NULL DEFAULT now(),
  finished_at     timestamptz,
  -- Receipts of the latest attempt's calls.
  result          jsonb,
  -- The final stdout or the local action's output, size-limited by the dispatcher.
  output          bytea,
  error           text,
  idempotency_key text,
  CONSTRAINT queue_items_held_has_owner CHECK (state NOT IN ('claimed', 'running') OR claimed_by IS NOT NULL)
);

-- The claim path, in claim order: kind, then priority (most urgent first), then the time the
-- item became eligible, then submission order. Only queued rows are indexed, so the index
-- stays as small as the backlog however many finished rows the table keeps.
CREATE INDEX queue_items_claim_idx ON queue_items (kind, priority DESC, start_after, seq)
  WHERE state = 'queued';

-- The stale-claim sweep and per-fylr holdings.
CREATE INDEX queue_items_held_idx ON queue_items (claimed_by)
  WHERE state IN ('claimed', 'running');

CREATE UNIQUE INDEX queue_items_idempotency_key_idx ON queue_items (idempotency_key)
  WHERE idempotency_key IS NOT NULL;
