// Postgres executor time per item, per statement (pg_stat_statements), for the dispatcher
// draining no-op local items the way the claims bench does: N items submitted through
// Dispatcher.submit (the group insert) with the dispatcher stopped, then claimed, run and
// completed with CONCURRENCY in flight. Executor time is the server's own clock for each
// statement (triggers, index and event writes included), so it is far steadier than a wall
// or CPU time on a loaded machine: alternating runs of two checkouts compare well.
//
//   [PG_SHAPE=exec] node --import tsx bench/pg-statements.ts [N=4000] [CONCURRENCY=8]
import { chmodSync, mkdtempSync, readdirSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createDefaultActions, migrate, normalizeSubmit, QueueStore } from "../src/dispatcher/index.js";
import { noopDrainDispatcher } from "./lib/noop-drain.js";
import { createPgPool } from "../src/shared/postgres.js";
import { printStatements, resetStatements, startPostgresWithStatements } from "./lib/pg-stat-statements.js";
import { CpuMeter } from "./lib/proc-cpu.js";

const n = Number(process.argv[2] ?? 4000);
const concurrency = Number(process.argv[3] ?? 8);
const dir = mkdtempSync(join(tmpdir(), "pg-statements-"));
chmodSync(dir, 0o755); // as root the embedded server runs as the "postgres" user
const dataDir = join(dir, "pg");

const server = await startPostgresWithStatements(dataDir);
await migrate(server.url);
const pool = createPgPool({ connectionString: server.url, max: concurrency + 2 });
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

// PG_SHAPE=exec: one exec item at a time on one connection through the statements the
// end-to-end shape sends it (a submit claimed in its insert, the running mark, the
// single-row completion), with no dispatcher around them: the fixed cost per statement.
const shape = process.env.PG_SHAPE === "exec" ? "exec" : "drain";
const execQueue = new QueueStore(pool);
if (shape === "exec") await execQueue.registerFylr({ id: "bench", hostname: "h", pid: process.pid });
const execSubmit = normalizeSubmit({ calls: [{ service: "true", args: [], env: {} }] }, createDefaultActions(), { maxInputBytes: 1024, defaultMaxAttempts: 3 });

async function execRound(items: number): Promise<void> {
  for (let i = 0; i < items; i++) {
    const { item } = await execQueue.submit(execSubmit, "bench");
    const fence = { id: item.id, claimedBy: item.claimedBy!, lease: item.lease };
    if (!(await execQueue.markRunning(fence)) || !(await execQueue.complete(fence, [], undefined))) throw new Error("fenced");
  }
}

async function round(items: number): Promise<void> {
  if (shape === "exec") return execRound(items);
  const dispatcher = noopDrainDispatcher(pool, concurrency);
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
await resetStatements(server.url);
// The CPU of this server's processes only, not of other servers on the machine.
const meter = new CpuMeter({ postgres: serverPids });
meter.start();
await round(n);
const cpu = meter.stop();
const top = await printStatements(server.url, n, (line) => process.stdout.write(line));
const what = shape === "exec" ? "exec items one at a time (PG_SHAPE=exec)" : `local no-op items, ${concurrency} in flight`;
process.stdout.write(`(${n} ${what}; executor ms per item ${top.execMs.toFixed(4)})\n`);
process.stdout.write(`Postgres CPU ms per item: ${(cpu.postgres! / n).toFixed(3)}\n`);
const stats = await pool.query(
  "SELECT n_tup_upd, n_tup_hot_upd, n_tup_ins FROM pg_stat_user_tables WHERE relname = 'queue_items'",
);
process.stdout.write(`queue_items: ${JSON.stringify(stats.rows[0])}\n`);
await pool.end();
await server.stop();
rmSync(dir, { recursive: true, force: true });
