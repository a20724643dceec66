// queue-size: the claim path with a year's worth of rows in the queue table. Claim +
// complete items/s and the claim statement's p50/p99 with 10⁶ finished rows and 10⁵ queued
// rows in queue_items, against the same loop on an empty table (only the queued items the
// loop takes), in the same run on the same Postgres server, rounds alternating.
//
//   npm run bench -- queue-size                            10⁶ finished, 10⁵ queued
//   QUEUE_SIZE=small npm run bench -- queue-size           10⁵ finished, 10⁴ queued (a quick check)
//   QUEUE_SIZE_FINISHED=… QUEUE_SIZE_QUEUED=… QUEUE_SIZE_ITEMS=… QUEUE_SIZE_WORKERS=8 QUEUE_SIZE_ROUNDS=3
//
// The loop is the dispatcher's own queue code (QueueStore.claim, QueueStore.complete — the
// statements a fylr runs): WORKERS loops on one pool, each claiming one exec item and
// completing it, ITEMS items per round. The full table is filled by INSERT … SELECT
// generate_series: finished rows (succeeded, some failed and cancelled) spread over the last
// 7 days with a receipt and a short output each, as a week of `queue.retention` leaves
// them; the queued backlog is topped up to its size before each round. Before every round
// both tables get VACUUM ANALYZE, as autovacuum would have done to a table of that age.
// The notes print the claim statement's plan (EXPLAIN ANALYZE) on the full table.
//
// Postgres: DATABASE_URL when set, else an embedded server in a temp dir.
import { randomBytes } from "node:crypto";
import { chmodSync, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { create } from "@bufbuild/protobuf";
import pg from "pg";
import { ReceiptSchema } from "../gen/slotbroker/v1/broker_pb.js";
import { inlineOutput, migrate, QueueStore, type CallResult } from "../src/dispatcher/index.js";
import { claimItems } from "../src/dispatcher/queue/sql.js";
import { startEmbeddedPostgres, type LocalPostgres } from "../src/shared/embedded-postgres.js";
import { createPgPool } from "../src/shared/postgres.js";
import { emit, percentile } from "./lib/figure.js";

const small = process.env.QUEUE_SIZE === "small";
const finishedRows = Number(process.env.QUEUE_SIZE_FINISHED ?? (small ? 100_000 : 1_000_000));
const queuedRows = Number(process.env.QUEUE_SIZE_QUEUED ?? (small ? 10_000 : 100_000));
const items = Number(process.env.QUEUE_SIZE_ITEMS ?? (small ? 2_000 : 5_000));
const workers = Number(process.env.QUEUE_SIZE_WORKERS ?? 8);
const rounds = Number(process.env.QUEUE_SIZE_ROUNDS ?? 3);
if (items > queuedRows) throw new Error(`QUEUE_SIZE_ITEMS (${items}) must not exceed the queued rows (${queuedRows})`);

const note = (text: string): void => void process.stderr.write(`queue-size: ${text}\n`);
const fylrId = "bench-fylr";
const payload = JSON.stringify({ calls: [{ service: "true", args: [], env: {} }] });
const results: CallResult[] = [{ service: "true", receipt: create(ReceiptSchema, { exitCode: 0, instanceId: "exec-bench" }) }];
const minPriority = -2147483648;
const output = inlineOutput(Buffer.from("ok\n"));

interface Round {
  readonly itemsPerS: number;
  /** Claim statement round trips, in ms. */
  readonly claimMs: number[];
}

/** One round: `workers` loops claim one item and complete it until `items` are done. */
async function round(pool: pg.Pool): Promise<Round> {
  const queue = new QueueStore(pool);
  const claimMs: number[] = [];
  let left = items;
  const t0 = performance.now();
  await Promise.all(
    Array.from({ length: workers }, async () => {
      while (left > 0) {
        left -= 1;
        const start = performance.now();
        const [item] = await queue.claim(fylrId, "exec", minPriority, 1);
        claimMs.push(performance.now() - start);
        if (!item) throw new Error("the queue ran dry: more items than queued rows");
        if (!(await queue.complete({ id: item.id, claimedBy: item.claimedBy, lease: item.lease }, results, output))) {
          throw new Error(`completion of ${item.id} was fenced`);
        }
      }
    }),
  );
  return { itemsPerS: items / ((performance.now() - t0) / 1000), claimMs };
}

/** Tops the queued backlog up to `target` rows, then VACUUM ANALYZE (what autovacuum would have done). */
async function prepare(pool: pg.Pool, target: number): Promise<void> {
  const queued = (await pool.query<{ n: number }>("SELECT count(*)::int AS n FROM queue_items WHERE state = 'queued'")).rows[0]!.n;
  if (queued < target) await pool.query("INSERT INTO queue_items (kind, payload) SELECT 'exec', $1 FROM generate_series(1, $2)", [payload, target - queued]);
  await pool.query("VACUUM ANALYZE queue_items");
}

/** A week of finished rows, and the queued backlog. */
async function fill(pool: pg.Pool): Promise<void> {
  const t0 = performance.now();
  const result = JSON.stringify({ calls: [{ service: "true", receipt: { exitCode: 0, instanceId: "exec-bench", durationMs: "3" } }] });
  // In slices, so no single statement holds 10⁶ rows' worth of WAL and locks at once.
  const slice = 100_000;
  for (let from = 0; from < finishedRows; from += slice) {
    await pool.query(
      `INSERT INTO queue_items (kind, priority, payload, state, claimed_by, lease, attempts, created_at, claimed_at, updated_at, finished_at, result, output, error)
       SELECT 'exec', g % 3, $1::jsonb,
              CASE WHEN g % 50 = 0 THEN 'failed' WHEN g % 97 = 0 THEN 'cancelled' ELSE 'succeeded' END,
              'old-fylr-' || (g % 4), 1, 1, t - interval '20 ms', t - interval '10 ms', t, t, $2::jsonb,
              '\\x6f6b0a'::bytea, CASE WHEN g % 50 = 0 THEN 'exit code 1' END
       FROM generate_series($3::int, $4::int) g,
            LATERAL (SELECT now() - interval '7 days' + (g::double precision / $5) * interval '7 days' AS t) at`,
      [payload, result, from + 1, Math.min(finishedRows, from + slice), finishedRows],
    );
  }
  await prepare(pool, queuedRows);
  note(`filled ${finishedRows} finished and ${queuedRows} queued rows in ${((performance.now() - t0) / 1000).toFixed(1)} s`);
}

async function tableBytes(pool: pg.Pool): Promise<number> {
  return Number((await pool.query<{ b: string }>("SELECT pg_total_relation_size('queue_items') AS b")).rows[0]!.b);
}

/** The claim statement's plan (QueueStore.claim's) on `pool`'s table, executed and rolled back. */
async function claimPlan(pool: pg.Pool): Promise<string> {
  const client = await pool.connect();
  try {
    await client.query("BEGIN");
    const text = `EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) ${claimItems}`;
    const plan = (await client.query<{ "QUERY PLAN": string }>(text, [fylrId, "exec", minPriority, 1])).rows.map((r) => r["QUERY PLAN"]).join("\n");
    await client.query("ROLLBACK");
    return plan;
  } finally {
    client.release();
  }
}

function median(xs: readonly number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.floor(s.length / 2)]!;
}

let server: LocalPostgres | undefined;
let dataRoot: string | undefined;
let adminUrl = process.env.DATABASE_URL;
if (!adminUrl) {
  dataRoot = mkdtempSync(join(tmpdir(), "slotbroker-bench-queue-size-"));
  chmodSync(dataRoot, 0o755); // as root the server runs as the "postgres" user
  server = await startEmbeddedPostgres({ dataDir: join(dataRoot, "data"), persistent: false });
  adminUrl = server.url;
}
const admin = new pg.Client(adminUrl);
await admin.connect();
const suffix = randomBytes(4).toString("hex");
const names = { full: `bench_qs_full_${suffix}`, empty: `bench_qs_empty_${suffix}` };
const urlOf = (db: string): string => {
  const u = new URL(adminUrl);
  u.pathname = `/${db}`;
  return u.toString();
};
const pools: pg.Pool[] = [];
try {
  for (const db of Object.values(names)) await admin.query(`CREATE DATABASE ${db}`);
  const full = createPgPool({ connectionString: urlOf(names.full), max: workers + 1 });
  const empty = createPgPool({ connectionString: urlOf(names.empty), max: workers + 1 });
  pools.push(full, empty);
  for (const pool of pools) {
    await migrate(pool);
    await new QueueStore(pool).registerFylr({ id: fylrId, hostname: "bench", pid: process.pid });
  }
  await fill(full);
  note(`claim plan with ${finishedRows} finished and ${queuedRows} queued rows:\n${await claimPlan(full)}`);

  // The empty table holds only the rows a round takes; emptied before each round.
  const tables = {
    full: { pool: full, prepare: () => prepare(full, queuedRows) },
    empty: { pool: empty, prepare: async () => (await empty.query("TRUNCATE queue_items CASCADE"), await prepare(empty, items)) },
  };
  const measured: Record<keyof typeof tables, Round[]> = { full: [], empty: [] };
  // A small uncounted round each first: plan caches and pools warm for both.
  for (const name of ["empty", "full"] as const) {
    await tables[name].prepare();
    note(`warm-up: ${name} ${(await round(tables[name].pool)).itemsPerS.toFixed(0)} items/s`);
  }
  for (let r = 0; r < rounds; r++) {
    for (const name of r % 2 === 0 ? (["empty", "full"] as const) : (["full", "empty"] as const)) {
      await tables[name].prepare();
      const result = await round(tables[name].pool);
      measured[name].push(result);
      const sorted = [...result.claimMs].sort((a, b) => a - b);
      note(`round ${r + 1}: ${name} ${result.itemsPerS.toFixed(0)} items/s, claim p50 ${percentile(sorted, 50).toFixed(2)} ms p99 ${percentile(sorted, 99).toFixed(2)} ms`);
    }
  }
  const claims = (name: keyof typeof tables) => measured[name].flatMap((m) => m.claimMs).sort((a, b) => a - b);
  const fullClaims = claims("full");
  const emptyClaims = claims("empty");
  const params = {
    finished_rows: finishedRows,
    queued_rows: queuedRows,
    items_per_round: items,
    workers,
    rounds,
    full_table_mb: Math.round((await tableBytes(full)) / 2 ** 20),
    empty_table_mb: Math.round((await tableBytes(empty)) / 2 ** 20),
    statistic: "median round (items/s); every claim of every round (latency)",
  };
  const baseline = "the same claim + complete loop on an empty table";
  emit({ bench: "queue-size", metric: "items_per_s_vs_empty", value: median(measured.full.map((m) => m.itemsPerS)), baseline, baseline_value: median(measured.empty.map((m) => m.itemsPerS)), params: { ...params, better: "higher ratio", goal: ">= 0.9" } });
  emit({ bench: "queue-size", metric: "claim_p50_vs_empty", value: percentile(fullClaims, 50), baseline, baseline_value: percentile(emptyClaims, 50), params: { ...params, unit: "ms", better: "lower ratio" } });
  emit({ bench: "queue-size", metric: "claim_p99_vs_empty", value: percentile(fullClaims, 99), baseline, baseline_value: percentile(emptyClaims, 99), params: { ...params, unit: "ms", better: "lower ratio", goal: "<= 1.5" } });
} finally {
  for (const pool of pools) await pool.end().catch(() => undefined);
  for (const db of Object.values(names)) await admin.query(`DROP DATABASE IF EXISTS ${db} WITH (FORCE)`).catch(() => undefined);
  await admin.end();
  await server?.stop();
  if (dataRoot) rmSync(dataRoot, { recursive: true, force: true });
}
