// Postgres executor time per item, per statement (pg_stat_statements), for the dispatcher
// draining no-op local items the way the claims bench does: N items submitted through
// Dispatcher.submit (the group insert) with the dispatcher stopped, then claimed, run and
// completed with CONCURRENCY in flight. Executor time is the server's own clock for each
// statement (triggers, index and event writes included), so it is far steadier than a wall
// or CPU time on a loaded machine: alternating runs of two checkouts compare well.
//
//   node --import tsx bench/pg-statements.ts [N=4000] [CONCURRENCY=8]
import { chmodSync, mkdtempSync, readdirSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import pg from "pg";
import { Dispatcher, LocalActionRegistry, ManualCapacitySource, migrate, reservedForHigh, type ExecBackend } from "../src/dispatcher/index.js";
import { startEmbeddedPostgres } from "../src/shared/embedded-postgres.js";
import { createPgPool } from "../src/shared/postgres.js";
import { CpuMeter } from "./lib/proc-cpu.js";

const n = Number(process.argv[2] ?? 4000);
const concurrency = Number(process.argv[3] ?? 8);
const dir = mkdtempSync(join(tmpdir(), "pg-statements-"));
chmodSync(dir, 0o755); // as root the embedded server runs as the "postgres" user
const dataDir = join(dir, "pg");

// pg_stat_statements must be preloaded: set it, then start the server again.
let server = await startEmbeddedPostgres({ dataDir, persistent: true });
{
  const c = new pg.Client(server.url);
  await c.connect();
  await c.query("ALTER SYSTEM SET shared_preload_libraries = 'pg_stat_statements'");
  await c.query("ALTER SYSTEM SET pg_stat_statements.track = 'all'");
  await c.end();
  await server.stop();
}
server = await startEmbeddedPostgres({ dataDir, persistent: false });
await migrate(server.url);
const pool = createPgPool({ connectionString: server.url, max: concurrency + 2 });
await pool.query("CREATE EXTENSION IF NOT EXISTS pg_stat_statements");
// PG_SETUP: SQL run after the migrations, to try a schema change before writing it as one.
if (process.env.PG_SETUP) await pool.query(process.env.PG_SETUP);

/** This server's processes: its postmaster (found by its data directory) and the postmaster's children. */
function serverPids(): number[] {
  for (const entry of readdirSync("/proc")) {
    if (!/^\d+$/.test(entry)) continue;
    try {
      const args = readFileSync(`/proc/${entry}/cmdline`, "utf8").split("\0");
      if (!args[0]!.endsWith("/postgres") || args[args.indexOf("-D") + 1] !== server.dataDir) continue;
      const children = readFileSync(`/proc/${entry}/task/${entry}/children`, "utf8").trim();
      return [Number(entry), ...(children ? children.split(" ").map(Number) : [])];
    } catch {
      // gone meanwhile, or not ours
    }
  }
  return [];
}

const noExec: ExecBackend = { run: () => Promise.reject(new Error("no exec items here")) };
const actions = new LocalActionRegistry().register("noop", { summary: "does nothing", run: () => Promise.resolve(Buffer.alloc(0)) });
let slots = concurrency;
while (slots - reservedForHigh(slots) < concurrency) slots += 1;

async function round(items: number): Promise<void> {
  const dispatcher = new Dispatcher({
    pool,
    capacity: new ManualCapacitySource(),
    backend: noExec,
    actions,
    migrate: false,
    config: { localSlots: slots, maxClaimBatch: concurrency },
  });
  const submitting: Promise<unknown>[] = [];
  for (let i = 0; i < items; i++) {
    submitting.push(dispatcher.submit({ local: { name: "noop", params: {}, input: Buffer.alloc(0) } }));
    if (submitting.length >= 64) await Promise.all(submitting.splice(0));
  }
  await Promise.all(submitting);
  await dispatcher.start();
  while (dispatcher.stats().counters.succeeded < items) await new Promise((r) => setTimeout(r, 1));
  await dispatcher.stop();
}

await round(200); // warm-up: plans cached, JIT off the table
await pool.query("SELECT pg_stat_statements_reset()");
// The CPU of this server's processes only, not of other servers on the machine.
const meter = new CpuMeter({ postgres: serverPids });
meter.start();
await round(n);
const cpu = meter.stop();
const { rows } = await pool.query<{ query: string; calls: string; ms: number; wal: string; hits: string; toplevel: boolean }>(
  `SELECT query, calls, total_exec_time AS ms, wal_records AS wal, shared_blks_hit + shared_blks_read AS hits, toplevel FROM pg_stat_statements
   WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database()) AND total_exec_time > 0
   ORDER BY toplevel DESC, total_exec_time DESC`,
);
const label = (text: string): string => text.trim().replace(/\s+/g, " ").slice(0, 110);
const top = { ms: 0, wal: 0, hits: 0 };
process.stdout.write("  ms/item calls/item  WAL rec/item  buffers/item  statement (executor; nested ones indented)\n");
for (const r of rows) {
  const per = { ms: r.ms / n, wal: Number(r.wal) / n, hits: Number(r.hits) / n };
  if (r.toplevel) for (const k of ["ms", "wal", "hits"] as const) top[k] += per[k];
  if (per.ms < 0.0005) continue;
  const cols = [per.ms.toFixed(4).padStart(9), (Number(r.calls) / n).toFixed(3).padStart(10), per.wal.toFixed(2).padStart(13), per.hits.toFixed(1).padStart(13)];
  process.stdout.write(`${cols.join(" ")}  ${r.toplevel ? "" : "  "}${label(r.query)}\n`);
}
process.stdout.write(`per item, top-level statements: executor ms ${top.ms.toFixed(4)}, WAL records ${top.wal.toFixed(2)}, buffers ${top.hits.toFixed(1)} (${n} local no-op items, ${concurrency} in flight)\n`);
process.stdout.write(`Postgres CPU ms per item: ${(cpu.postgres! / n).toFixed(3)}\n`);
const stats = await pool.query(
  "SELECT n_tup_upd, n_tup_hot_upd, n_tup_ins FROM pg_stat_user_tables WHERE relname = 'queue_items'",
);
process.stdout.write(`queue_items: ${JSON.stringify(stats.rows[0])}\n`);
await pool.end();
await server.stop();
rmSync(dir, { recursive: true, force: true });
