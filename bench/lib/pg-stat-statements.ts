// An embedded Postgres with pg_stat_statements (nested statements and planning tracked),
// and a per-item table of what each statement cost it: for bench/pg-statements.ts and
// bench/e2e-statements.ts.
import pg from "pg";
import { startEmbeddedPostgres, type LocalPostgres } from "../../src/shared/embedded-postgres.js";

/** Starts the server with pg_stat_statements preloaded (set, then started again) and the extension created. */
export async function startPostgresWithStatements(dataDir: string): Promise<LocalPostgres> {
  const first = await startEmbeddedPostgres({ dataDir, persistent: true });
  const c = new pg.Client(first.url);
  await c.connect();
  await c.query("ALTER SYSTEM SET shared_preload_libraries = 'pg_stat_statements'");
  await c.query("ALTER SYSTEM SET pg_stat_statements.track = 'all'");
  await c.query("ALTER SYSTEM SET pg_stat_statements.track_planning = on");
  await c.end();
  await first.stop();
  const server = await startEmbeddedPostgres({ dataDir, persistent: false });
  const s = new pg.Client(server.url);
  await s.connect();
  await s.query("CREATE EXTENSION IF NOT EXISTS pg_stat_statements");
  await s.end();
  return server;
}

/** Forgets what was counted so far (e.g. a warm-up's statements). */
export async function resetStatements(url: string): Promise<void> {
  const c = new pg.Client(url);
  await c.connect();
  await c.query("SELECT pg_stat_statements_reset()");
  await c.end();
}

/** Per-item totals of the top-level statements. */
export interface StatementTotals {
  execMs: number;
  planMs: number;
  wal: number;
  buffers: number;
}

/**
 * Writes one line per statement of this database since the last reset, per item of `n`:
 * executor ms, planning ms, calls, WAL records, buffers; nested ones (triggers, functions'
 * statements, foreign-key checks) indented under the top-level ones, whose time includes
 * theirs. Returns the top-level totals.
 */
export async function printStatements(url: string, n: number, write: (line: string) => void): Promise<StatementTotals> {
  const c = new pg.Client(url);
  await c.connect();
  const { rows } = await c.query<{ query: string; calls: string; ms: number; plan: number; wal: string; hits: string; toplevel: boolean }>(
    `SELECT query, calls, total_exec_time AS ms, total_plan_time AS plan, wal_records AS wal,
            shared_blks_hit + shared_blks_read AS hits, toplevel
     FROM pg_stat_statements
     WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
       AND total_exec_time + total_plan_time > 0 AND query NOT LIKE '%pg_stat_statements%'
     ORDER BY toplevel DESC, total_exec_time + total_plan_time DESC`,
  );
  await c.end();
  const label = (text: string): string => text.trim().replace(/\s+/g, " ").slice(0, 100);
  const top: StatementTotals = { execMs: 0, planMs: 0, wal: 0, buffers: 0 };
  write("  exec ms  plan ms calls  WAL rec  buffers  statement (per item; nested ones indented)\n");
  for (const r of rows) {
    const per = { execMs: r.ms / n, planMs: r.plan / n, wal: Number(r.wal) / n, buffers: Number(r.hits) / n };
    if (r.toplevel) for (const k of ["execMs", "planMs", "wal", "buffers"] as const) top[k] += per[k];
    if (per.execMs + per.planMs < 0.0005) continue;
    const cols = [
      per.execMs.toFixed(4).padStart(9),
      per.planMs.toFixed(4).padStart(8),
      (Number(r.calls) / n).toFixed(2).padStart(5),
      per.wal.toFixed(2).padStart(8),
      per.buffers.toFixed(1).padStart(8),
    ];
    write(`${cols.join(" ")}  ${r.toplevel ? "" : "  "}${label(r.query)}\n`);
  }
  write(
    `per item, top-level statements: executor ms ${top.execMs.toFixed(4)}, planning ms ${top.planMs.toFixed(4)}, ` +
      `WAL records ${top.wal.toFixed(2)}, buffers ${top.buffers.toFixed(1)}\n`,
  );
  return top;
}
