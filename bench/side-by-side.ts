// Two fylr trees side by side, loaded at the same time: on a machine whose load comes and
// goes, two builds measured in turns see different machines, two measured together see the
// same one. Each side is one fylr (that tree's bench/lib/e2e-fylr.ts, so its own src) on a
// database of its own; both share two execservers (this tree's) on one embedded Postgres.
// Per round both sides get the same load at once, and per side it prints:
//   throughput  SUBMITTERS submitters per side, each waiting only for its Submit's answer
//               (the end-to-end bench's throughput load), ITEMS items: the fylr's CPU ms
//               per item (/proc), its database's Postgres backends' CPU ms per item, the
//               Submit answer's p50;
//   latency     one submitter per side, each waiting for its item to settle, LATENCY_ITEMS
//               items: submit → committed p50 and submit → settled p50.
//
//   node --import tsx bench/side-by-side.ts A_TREE B_TREE [service: true|sha256]
//        SBS_ROUNDS=3 SBS_ITEMS=400 SBS_LATENCY_ITEMS=200 SBS_SUBMITTERS=8 SBS_SLOTS=4
//        SBS_FYLR_NODE_ARGS="--cpu-prof --cpu-prof-dir=DIR"   (node flags for both fylrs; the
//        first line names each side's pid, which the profile's file name carries)
//
// A tree is a checkout of this repository (node_modules may be a link to this one's).
import { randomBytes } from "node:crypto";
import { chmodSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { performance } from "node:perf_hooks";
import { fileURLToPath } from "node:url";
import type { ChildProcess } from "node:child_process";
import { createInterface } from "node:readline";
import { createQueueClient, type QueueClient } from "../src/api/client.js";
import { migrate } from "../src/dispatcher/index.js";
import { startEmbeddedPostgres } from "../src/shared/embedded-postgres.js";
import { createDatabase } from "../harness/databases.js";
import { percentile } from "./lib/figure.js";
import { cpuMs, postgresBackends } from "./lib/proc-cpu.js";
import { startChild } from "./lib/raw-grpc.js";

const [treeA, treeB] = [process.argv[2], process.argv[3]].map((t) => resolve(t ?? "."));
const service = process.argv[4] === "sha256" ? "sha256" : "true";
const rounds = Number(process.env.SBS_ROUNDS ?? 3);
const items = Number(process.env.SBS_ITEMS ?? 400);
const latencyItems = Number(process.env.SBS_LATENCY_ITEMS ?? 200);
const submitters = Number(process.env.SBS_SUBMITTERS ?? 8);
const slots = Number(process.env.SBS_SLOTS ?? 4);
const here = dirname(fileURLToPath(import.meta.url));
const epochMs = (): number => performance.timeOrigin + performance.now();
const call = service === "true" ? { service } : { service, stdin: { case: "stdinData" as const, value: randomBytes(4096) } };
const median = (xs: number[]): number => Math.round(percentile([...xs].sort((a, b) => a - b), 50) * 100) / 100;

interface Side {
  readonly name: string;
  readonly child: ChildProcess;
  readonly client: QueueClient;
  readonly db: string;
  readonly settled: Map<string, number>;
  readonly waiters: Map<string, () => void>;
}

function follow(side: Omit<Side, "settled" | "waiters">): Side {
  const s: Side = { ...side, settled: new Map(), waiters: new Map() };
  createInterface({ input: side.child.stdout! }).on("line", (line) => {
    if (!line.startsWith('{"item"')) return;
    const r = JSON.parse(line) as { item: string; settled: number };
    s.settled.set(r.item, r.settled);
    s.waiters.get(r.item)?.();
  });
  return s;
}

async function settledAt(side: Side, id: string): Promise<number> {
  if (!side.settled.has(id)) await new Promise<void>((r) => side.waiters.set(id, r));
  side.waiters.delete(id);
  const at = side.settled.get(id)!;
  side.settled.delete(id);
  return at;
}

async function throughput(side: Side): Promise<{ cpu: number; pg: number; answerMs: number[] }> {
  const pg0 = new Map(postgresBackends(side.db).map((pid) => [pid, cpuMs(pid)]));
  const cpu0 = cpuMs(side.child.pid);
  let next = 0;
  const answerMs: number[] = [];
  const done: Promise<number>[] = [];
  await Promise.all(
    Array.from({ length: submitters }, async () => {
      while (next < items) {
        next++;
        const t0 = epochMs();
        const { item } = await side.client.submit({ calls: [call] });
        answerMs.push(epochMs() - t0);
        done.push(settledAt(side, item!.id));
      }
    }),
  );
  await Promise.all(done);
  // Backends that started meanwhile count whole; one that ended meanwhile is lost (rare).
  const pg = postgresBackends(side.db).reduce((sum, pid) => sum + cpuMs(pid) - (pg0.get(pid) ?? 0), 0);
  return { cpu: (cpuMs(side.child.pid) - cpu0) / items, pg: pg / items, answerMs };
}

async function latency(side: Side): Promise<{ committed: number[]; settled: number[] }> {
  const committed: number[] = [];
  const settled: number[] = [];
  for (let i = 0; i < latencyItems; i++) {
    const t0 = epochMs();
    const { item } = await side.client.submit({ calls: [call] });
    committed.push(epochMs() - t0);
    settled.push((await settledAt(side, item!.id)) - t0);
  }
  return { committed, settled };
}

const dir = mkdtempSync(join(tmpdir(), "bench-side-by-side-"));
chmodSync(dir, 0o755); // as root the embedded server runs as the "postgres" user
const server = await startEmbeddedPostgres({ dataDir: join(dir, "pg"), persistent: false });
const children: ChildProcess[] = [];
try {
  const execConfig = join(dir, "exec.yaml");
  writeFileSync(
    execConfig,
    `listen: 127.0.0.1:0\nadminListen: 127.0.0.1:0\nwaitgroups: {w: {processes: ${slots}}}\n` +
      `services: {"true": {waitgroup: w, command: ["true"]}, sha256: {waitgroup: w, command: ["sha256sum"]}}\n`,
  );
  const execs = await Promise.all([0, 1].map(() => startChild([join(here, "..", "src", "cli.ts"), "execserver", "--config", execConfig])));
  children.push(...execs.map((e) => e.child));
  const sides = await Promise.all(
    [
      ["A", treeA!],
      ["B", treeB!],
    ].map(async ([name, tree]) => {
      const db = await createDatabase(server.url, `sbs_${name!.toLowerCase()}`);
      await migrate(db.url);
      const config = { name: `sbs-${name}`, listen: "127.0.0.1:0", databaseUrl: db.url, execserver: { addresses: execs.map((e) => e.address) } };
      const fylr = await startChild([join(tree!, "bench", "lib", "e2e-fylr.ts"), JSON.stringify(config)], /url=(\S+)/, process.env.SBS_FYLR_NODE_ARGS);
      children.push(fylr.child);
      return follow({ name: name!, child: fylr.child, client: createQueueClient(fylr.address), db: db.name });
    }),
  );
  process.stdout.write(`side-by-side (${service}): A = ${treeA} (fylr pid ${sides[0]!.child.pid}), B = ${treeB} (fylr pid ${sides[1]!.child.pid})\n`);
  await Promise.all(sides.map((s) => latency(s))); // warm-up
  for (let r = 1; r <= rounds; r++) {
    const loaded = await Promise.all(sides.map((s) => throughput(s)));
    const timed = await Promise.all(sides.map((s) => latency(s)));
    for (const [i, s] of sides.entries()) {
      const t = loaded[i]!;
      const l = timed[i]!;
      process.stdout.write(
        `round ${r} ${s.name}: fylr CPU ${t.cpu.toFixed(2)} ms/item, Postgres ${t.pg.toFixed(2)} ms/item, answer p50 under load ${median(t.answerMs)} ms; ` +
          `alone: submit→committed p50 ${median(l.committed)} ms, submit→settled p50 ${median(l.settled)} ms\n`,
      );
    }
  }
} finally {
  for (const child of children) child.kill("SIGTERM");
  await Promise.all(children.map((c) => (c.exitCode !== null ? Promise.resolve() : new Promise<void>((r) => c.once("exit", () => r())))));
  await server.stop();
  rmSync(dir, { recursive: true, force: true });
}
