// Statements per item: how many queries the fylrs' dispatchers send to Postgres for one
// item, and what woke their claim loops. Two fylrs (the real startFylr) and one execserver
// in this process, an embedded Postgres; N items of the `true` service (or `sha256sum` of
// 4 KiB stdin), one at a time (or CONCURRENCY submitters, each waiting for its item, as
// under the end-to-end bench's throughput load), submitted to the fylrs in turn. Every query through each
// dispatcher's pool is counted by its SQL text (the blob store and the LISTEN connection
// are not counted). Exact, unlike a time: it changes only when the code does. It also
// prints the CPU ms per item of this process (fylrs, execserver and clients together; the
// commands it ran apart) and
// of the Postgres backends: noisy, but in one process alternating runs of two checkouts
// tell a change of about 5 % apart.
//
// With SUBMIT_ONLY=1 each submitter waits only for its Submit's answer before the next (the
// end-to-end bench's throughput load exactly), and the run waits for every item at the end.
// With PG_STATS=1 the server runs with pg_stat_statements and the run also prints, per item
// and statement (nested ones too), the executor and planning ms Postgres spent.
//
//   [RUNNING_MARK_DELAY=100ms] [SUBMIT_ONLY=1] [PG_STATS=1] node --import tsx bench/e2e-statements.ts [true|sha256] [N] [CONCURRENCY]
import { chmodSync, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type pg from "pg";
import { createQueueClient } from "../src/api/client.js";
import { compileFylrConfig, startExecserver, startFylr, type FylrHandle } from "../src/app/index.js";
import { migrate } from "../src/dispatcher/index.js";
import { compileExecserverConfig } from "../src/execserver/index.js";
import { startEmbeddedPostgres } from "../src/shared/embedded-postgres.js";
import { printStatements, resetStatements, startPostgresWithStatements } from "./lib/pg-stat-statements.js";
import { CpuMeter, postgresBackends } from "./lib/proc-cpu.js";

const service = process.argv[2] === "sha256" ? "sha256" : "true";
const n = Number(process.argv[3] ?? 100);
const concurrency = Number(process.argv[4] ?? 1);
// RUNNING_MARK_DELAY=250ms sets dispatcher.runningMarkDelay (a fylr of this version only).
const markDelay = process.env.RUNNING_MARK_DELAY ? { dispatcher: { runningMarkDelay: process.env.RUNNING_MARK_DELAY } } : {};
const dir = mkdtempSync(join(tmpdir(), "e2e-statements-"));
chmodSync(dir, 0o755); // as root the embedded server runs as the "postgres" user
const pgStats = process.env.PG_STATS === "1";
const server = pgStats
  ? await startPostgresWithStatements(join(dir, "pg"))
  : await startEmbeddedPostgres({ dataDir: join(dir, "pg"), persistent: false });
await migrate(server.url);
const execConfig = compileExecserverConfig({
  listen: "127.0.0.1:0",
  adminListen: "127.0.0.1:0",
  waitgroups: { w: { processes: 4 } },
  services: { true: { waitgroup: "w", command: ["true"] }, sha256: { waitgroup: "w", command: ["sha256sum"] } },
});
const exec = await startExecserver(execConfig);
const counts = new Map<string, number>();
const count = (key: string): void => void counts.set(key, (counts.get(key) ?? 0) + 1);
// The first words of a statement name it well enough: "INSERT INTO queue_items", "UPDATE queue_items q SET state = 'running'".
const label = (text: string): string => text.trim().replace(/\s+/g, " ").slice(0, 70);
const fylrs: FylrHandle[] = [];
for (const name of ["a", "b"]) {
  const fylr = await startFylr(compileFylrConfig({ name, listen: "127.0.0.1:0", databaseUrl: server.url, execserver: { addresses: [exec.grpcAddress] }, ...markDelay }));
  const pool = (fylr.dispatcher.queue as unknown as { pool: pg.Pool }).pool;
  const query = pool.query.bind(pool) as (...args: unknown[]) => unknown;
  (pool as unknown as { query: (...args: unknown[]) => unknown }).query = (...args: unknown[]) => {
    const first = args[0] as string | { text: string };
    count(label(typeof first === "string" ? first : first.text));
    return query(...args);
  };
  fylr.dispatcher.events.on("wakeup", (source) => count(`(claim loop woken by ${source})`));
  fylr.dispatcher.events.on("item:started", () => count("(items written running)"));
  fylrs.push(fylr);
}
const clients = fylrs.map((f) => createQueueClient(f.url));
const stdin = Buffer.alloc(4096, 7);
const call = service === "true" ? { service } : { service, stdin: { case: "stdinData" as const, value: stdin } };
const waiting = new Map<string, () => void>();
const early = new Set<string>(); // succeeded before its submit answered
for (const f of fylrs) {
  f.dispatcher.events.on("item:succeeded", (item) => {
    const resolve = waiting.get(item.id);
    if (resolve) resolve();
    else early.add(item.id);
  });
}
const submitOnly = process.env.SUBMIT_ONLY === "1";
const settling: Promise<void>[] = [];
async function one(i: number): Promise<void> {
  const { item } = await clients[i % clients.length]!.submit({ calls: [call] });
  const id = item!.id;
  const settled = early.delete(id) ? Promise.resolve() : new Promise<void>((resolve) => waiting.set(id, resolve));
  if (submitOnly) return void settling.push(settled);
  await settled;
  waiting.delete(id);
  if (concurrency === 1) await new Promise((r) => setTimeout(r, 20)); // the passes an item's end starts belong to it
}
async function run(items: number): Promise<void> {
  let next = 0;
  await Promise.all(Array.from({ length: concurrency }, async () => {
    while (next < items) await one(next++);
  }));
  await Promise.all(settling.splice(0));
}
await run(10); // warm-up
counts.clear();
if (pgStats) await resetStatements(server.url);
const database = new URL(server.url).pathname.slice(1) || "postgres";
const meter = new CpuMeter({ process: () => [process.pid], postgres: () => postgresBackends(database) });
meter.start();
await run(n);
const cpu = meter.stop();
let total = 0;
for (const [key, value] of [...counts].sort()) {
  if (!key.startsWith("(")) total += value;
  process.stdout.write(`${(value / n).toFixed(2).padStart(6)}  ${key}\n`);
}
const how = concurrency === 1 ? "one at a time" : `${concurrency} submitters${submitOnly ? " (each waiting for its answer only)" : ""}`;
process.stdout.write(`statements per item (${service}, two fylrs, ${how}, ${n} items): ${(total / n).toFixed(2)}\n`);
const commands = cpu["process(children)"] ?? 0;
process.stdout.write(`CPU ms per item: this process ${((cpu.process! - commands) / n).toFixed(2)} (its commands ${(commands / n).toFixed(2)}), Postgres backends ${(cpu.postgres! / n).toFixed(2)}\n`);
if (pgStats) await printStatements(server.url, n, (line) => process.stdout.write(line));
for (const fylr of fylrs) await fylr.close();
await exec.close();
await server.stop();
rmSync(dir, { recursive: true, force: true });
