// claims: dispatcher claim + complete of no-op local items per second, against pg-boss and
// graphile-worker doing the same no-op jobs on the same Postgres with the same concurrency,
// in the same run (see bench/README.md). Each system drains a pre-filled backlog of ITEMS jobs
// with CONCURRENCY jobs in flight; the clock runs from starting the consumer until the last
// completion is in the database. Rounds rotate the order; figures are the median round.
//
//   npm run bench -- claims          CLAIMS_ITEMS=4000 CLAIMS_CONCURRENCY=8 CLAIMS_ROUNDS=5
//
// Notes on fairness: pg-boss runs its fetch(batchSize 1) + complete primitives in tight
// loops, because its work() loop sleeps pollingIntervalSeconds (≥ 0.5 s) between fetches.
// graphile-worker runs as shipped (run() with `concurrency`). The dispatcher runs its real
// loop: local no-op items, normal priority, local slots sized so that `concurrency` of them
// run at once; it batches completions that finish together into one statement.
//
// Postgres: DATABASE_URL when set, else an embedded server in a temp dir (fsync off, the same
// for all three).
import { randomBytes } from "node:crypto";
import { chmodSync, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Logger as GraphileLogger, run as runGraphile, runMigrations as migrateGraphile } from "graphile-worker";
import pg from "pg";
import PgBoss from "pg-boss";
import { migrate } from "../src/dispatcher/index.js";
import { noopDrainDispatcher, noopPayload } from "./lib/noop-drain.js";
import { startEmbeddedPostgres, type LocalPostgres } from "../src/shared/embedded-postgres.js";
import { emit } from "./lib/figure.js";
import { createPgPool } from "../src/shared/postgres.js";

let items = Number(process.env.CLAIMS_ITEMS ?? 4000);
const concurrency = Number(process.env.CLAIMS_CONCURRENCY ?? 8);
const rounds = Number(process.env.CLAIMS_ROUNDS ?? 5);

const note = (text: string): void => void process.stderr.write(`claims: ${text}\n`);

/** Resolves when `check()` holds, polling every millisecond (the same for every system). */
async function until(check: () => boolean | Promise<boolean>): Promise<void> {
  while (!(await check())) await new Promise((r) => setTimeout(r, 1));
}

// --- slotbroker dispatcher --------------------------------------------------------------

async function dispatcherRound(url: string): Promise<number> {
  const pool = createPgPool({ connectionString: url, max: concurrency + 2 });
  try {
    await pool.query("TRUNCATE queue_items, fylrs CASCADE");
    await pool.query("INSERT INTO queue_items (kind, priority, payload) SELECT 'local', 0, $1 FROM generate_series(1, $2)", [noopPayload, items]);
    await pool.query("VACUUM ANALYZE queue_items");
    const dispatcher = noopDrainDispatcher(pool, concurrency);
    const t0 = performance.now();
    await dispatcher.start();
    await until(() => dispatcher.stats().counters.succeeded >= items);
    const seconds = (performance.now() - t0) / 1000;
    await dispatcher.stop();
    return items / seconds;
  } finally {
    await pool.end();
  }
}

// --- pg-boss ------------------------------------------------------------------------------

async function pgBossRound(boss: PgBoss, round: number): Promise<number> {
  const queue = `noop_${round < 0 ? "warmup" : round}`;
  await boss.createQueue(queue);
  for (let i = 0; i < items; i += 1000) {
    await boss.insert(Array.from({ length: Math.min(1000, items - i) }, () => ({ name: queue, data: {} })));
  }
  let done = 0;
  // pg-boss's own work() loop sleeps pollingIntervalSeconds (≥ 0.5 s) after every fetch, which
  // would cap it far below the others; its fetch/complete primitives in tight loops are the
  // fastest it goes at a given concurrency.
  const worker = async (): Promise<void> => {
    for (;;) {
      const jobs = await boss.fetch(queue, { batchSize: 1 });
      if (!jobs || jobs.length === 0) return;
      for (const job of jobs) {
        await boss.complete(queue, job.id);
        done += 1;
      }
    }
  };
  const t0 = performance.now();
  await Promise.all(Array.from({ length: concurrency }, worker));
  const seconds = (performance.now() - t0) / 1000;
  if (done !== items) throw new Error(`pg-boss completed ${done} of ${items}`);
  return items / seconds;
}

// --- graphile-worker ------------------------------------------------------------------------

const quiet = new GraphileLogger(() => () => undefined);

async function graphileRound(url: string, pool: pg.Pool): Promise<number> {
  await pool.query(
    `SELECT graphile_worker.add_jobs(array(
       SELECT ROW('noop', '{}'::json, NULL, NULL, NULL, NULL, NULL, NULL)::graphile_worker.job_spec
       FROM generate_series(1, $1)))`,
    [items],
  );
  let done = 0;
  const t0 = performance.now();
  const runner = await runGraphile({
    connectionString: url,
    concurrency,
    maxPoolSize: concurrency + 2,
    noHandleSignals: true,
    pollInterval: 1000,
    logger: quiet,
    taskList: {
      noop: () => {
        done += 1;
        return Promise.resolve();
      },
    },
  });
  await until(() => done >= items);
  await until(async () => (await pool.query<{ n: number }>("SELECT count(*)::int AS n FROM graphile_worker._private_jobs")).rows[0]!.n === 0);
  const seconds = (performance.now() - t0) / 1000;
  await runner.stop();
  return items / seconds;
}

// --- the run ------------------------------------------------------------------------------

function median(xs: number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.floor(s.length / 2)]!;
}

let server: LocalPostgres | undefined;
let dataRoot: string | undefined;
let adminUrl = process.env.DATABASE_URL;
if (!adminUrl) {
  dataRoot = mkdtempSync(join(tmpdir(), "slotbroker-bench-claims-"));
  chmodSync(dataRoot, 0o755); // as root the server runs as the "postgres" user
  server = await startEmbeddedPostgres({ dataDir: join(dataRoot, "data"), persistent: false });
  adminUrl = server.url;
}
const admin = new pg.Client(adminUrl);
await admin.connect();
const suffix = randomBytes(4).toString("hex");
const names = { dispatcher: `bench_sb_${suffix}`, pgboss: `bench_boss_${suffix}`, graphile: `bench_gw_${suffix}` };
const urlOf = (db: string): string => {
  const u = new URL(adminUrl);
  u.pathname = `/${db}`;
  return u.toString();
};
let boss: PgBoss | undefined;
let graphilePool: pg.Pool | undefined;
try {
  for (const db of Object.values(names)) await admin.query(`CREATE DATABASE ${db}`);
  await migrate(urlOf(names.dispatcher));
  boss = new PgBoss({ connectionString: urlOf(names.pgboss), max: concurrency + 2, supervise: false, schedule: false });
  boss.on("error", (err) => note(`pg-boss error: ${String(err)}`));
  await boss.start();
  await migrateGraphile({ connectionString: urlOf(names.graphile), logger: quiet });
  graphilePool = createPgPool({ connectionString: urlOf(names.graphile), max: 2 });

  const rates = { dispatcher: [] as number[], pgboss: [] as number[], graphile: [] as number[] };
  const systems = [
    ["dispatcher", () => dispatcherRound(urlOf(names.dispatcher))],
    ["pgboss", (r: number) => pgBossRound(boss!, r)],
    ["graphile", () => graphileRound(urlOf(names.graphile), graphilePool!)],
  ] as const;
  // One small uncounted round each first: JIT, plan caches and pools warm for everyone.
  const measured = items;
  items = Math.min(500, measured);
  for (const [name, fn] of systems) note(`warm-up: ${name} ${(await fn(-1)).toFixed(0)} items/s`);
  items = measured;
  for (let r = 0; r < rounds; r++) {
    for (let i = 0; i < systems.length; i++) {
      const [name, fn] = systems[(i + r) % systems.length]!;
      const rate = await fn(r);
      rates[name].push(rate);
      note(`round ${r + 1}: ${name} ${rate.toFixed(0)} items/s`);
    }
  }
  const dispatcher = median(rates.dispatcher);
  const pgboss = median(rates.pgboss);
  const graphile = median(rates.graphile);
  const params = { items, concurrency, rounds, statistic: "median round", better: "higher ratio" };
  emit({ bench: "claims", metric: "items_per_s", value: dispatcher, baseline: "pg-boss 10.1.6 (fetch batchSize 1 + complete loops)", baseline_value: pgboss, params });
  emit({ bench: "claims", metric: "items_per_s", value: dispatcher, baseline: "graphile-worker 0.16.6 (run, concurrency)", baseline_value: graphile, params });
  const faster = pgboss >= graphile ? "pg-boss 10.1.6" : "graphile-worker 0.16.6";
  emit({ bench: "claims", metric: "items_per_s_vs_faster", value: dispatcher, baseline: faster, baseline_value: Math.max(pgboss, graphile), params: { ...params, goal: ">= 1.0" } });
} finally {
  await boss?.stop({ graceful: false, wait: true }).catch(() => undefined);
  await graphilePool?.end().catch(() => undefined);
  for (const db of Object.values(names)) await admin.query(`DROP DATABASE IF EXISTS ${db} WITH (FORCE)`).catch(() => undefined);
  await admin.end();
  await server?.stop();
  if (dataRoot) rmSync(dataRoot, { recursive: true, force: true });
}
