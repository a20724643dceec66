// `npm run soak -- --minutes N [--rate R] [--seed S]`: a chaos soak on loopback. Starts a
// fleet (Postgres, execservers behind HAProxy and direct, fylrs, chaos proxies), submits a
// seeded mix of items for N minutes while the driver injects faults, lets the fleet heal
// and drain, then checks every invariant (load/soak/checker.ts). Exit 1 on any violation.
import { chmodSync, mkdtempSync, readFileSync, readdirSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { parseArgs } from "node:util";
import pg from "pg";
import { getStatus } from "../../harness/execserver-process.js";
import { jobDirsUnder } from "../../harness/job-dirs.js";
import { RUN_MARKER, sweepLeftovers } from "../processes.js";
import { check, parseLedger, type ExecOutcome, type FinalRow } from "./checker.js";
import { ChaosDriver } from "./driver.js";
import { ExitWatcher } from "./exit-watch.js";
import { startFleet, type Fleet } from "./fleet.js";
import { makeItem, prng, submitBody, writeJobScript, type SoakItem } from "./jobs.js";
import { buildChildren, removeBuild } from "../../harness/node-children.js";

const root = resolve(dirname(fileURLToPath(import.meta.url)), "..", "..");
const { values: args } = parseArgs({
  options: {
    minutes: { type: "string", default: "2" },
    rate: { type: "string", default: "10" },
    seed: { type: "string" },
    "drain-seconds": { type: "string", default: "75" },
    "max-backlog": { type: "string", default: "300" },
    "postgres-every-seconds": { type: "string", default: "30" },
    verbose: { type: "boolean", default: false },
    keep: { type: "boolean", default: false },
    // For proving the checker bites: pretend one more item was accepted than was submitted
    // (a lost item) and one item's job ran once more (an unexplained duplicate).
    "inject-violation": { type: "boolean", default: false },
  },
});

const started = Date.now();
const seed = args.seed ? Number(args.seed) : Math.floor(Math.random() * 2 ** 31);
const runId = `soak${seed.toString(36)}`;
const rand = prng(seed);
process.env[RUN_MARKER] = runId; // HAProxy and Postgres inherit it too: the final sweep finds them
const chaosRand = prng(seed ^ 0x5eed);
const log = (line: string): void => console.log(`[${((Date.now() - started) / 1000).toFixed(1).padStart(6)} s] ${line}`);
const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));

const SCHEMA = `
CREATE TABLE IF NOT EXISTS soak_completions (id uuid NOT NULL, state text NOT NULL, lease bigint, at timestamptz NOT NULL DEFAULT now());
CREATE OR REPLACE FUNCTION soak_completion() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN INSERT INTO soak_completions (id, state, lease) VALUES (NEW.id, NEW.state, NEW.lease); RETURN NEW; END $$;
DROP TRIGGER IF EXISTS soak_completion ON queue_items;
CREATE TRIGGER soak_completion AFTER UPDATE ON queue_items FOR EACH ROW
  WHEN (NEW.state IN ('succeeded', 'failed') AND OLD.state IS DISTINCT FROM NEW.state) EXECUTE FUNCTION soak_completion();`;

async function query<T extends pg.QueryResultRow>(url: string, text: string, values: unknown[] = []): Promise<T[]> {
  const client = new pg.Client({ connectionString: url, connectionTimeoutMillis: 3_000 });
  client.on("error", () => undefined);
  try {
    await client.connect();
    return (await client.query<T>(text, values)).rows;
  } finally {
    await client.end().catch(() => undefined);
  }
}

/** Submits one item until some fylr accepts it (bounded); true when accepted. */
async function submit(fleet: Fleet, item: SoakItem, ledger: string, deadline: number): Promise<boolean> {
  const body = JSON.stringify(submitBody(item, ledger));
  for (let attempt = 0; Date.now() < deadline; attempt++) {
    const url = fleet.fylrUrls[(Number(item.tag.slice(-6)) + attempt) % fleet.fylrUrls.length]!;
    try {
      const res = await fetch(`${url}/slotbroker.v1.QueueService/Submit`, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body,
        signal: AbortSignal.timeout(5_000),
      });
      if (res.ok) return true;
      await res.body?.cancel();
    } catch {
      /* fylr down or frozen: the next one */
    }
    await sleep(200);
  }
  return false;
}

async function openCount(url: string): Promise<number> {
  const [row] = await query<{ n: number }>(url, `SELECT count(*)::int AS n FROM queue_items WHERE state IN ('queued', 'claimed', 'running')`);
  return row?.n ?? 0;
}

/** Job processes found left over; killed before the work dir is removed. */
const strays = new Set<number>();

async function leftovers(fleet: Fleet, jobScript: string): Promise<string[]> {
  const found: string[] = [];
  for (const [i, address] of fleet.execAddresses.entries()) {
    try {
      const s = await getStatus(address);
      for (const w of s.waitgroups) if (w.running + w.offered > 0 || w.waiting > 0n) found.push(`execserver-${i} ${w.name}: running ${w.running}, offered ${w.offered}, wants ${w.waiting}`);
      for (const c of s.connections) if (c.wantsParked > 0n) found.push(`execserver-${i} connection ${c.clientName}: ${c.wantsParked} wants parked`);
    } catch (err) {
      found.push(`execserver-${i}: GetStatus failed: ${(err as Error).message}`);
    }
  }
  for (const pid of readdirSync("/proc").filter((d) => /^\d+$/.test(d))) {
    try {
      const cmd = readFileSync(`/proc/${pid}/cmdline`, "utf8").split("\0").join(" ");
      if (cmd.includes(jobScript)) {
        found.push(`job process ${pid}: ${cmd.slice(0, 160)}`);
        strays.add(Number(pid));
      }
    } catch {
      /* gone */
    }
  }
  return found;
}

/** The execservers' "job failed" lines (JSON, info level), by the job's pid. */
function readOutcomes(logs: readonly string[]): Map<number, ExecOutcome[]> {
  const out = new Map<number, ExecOutcome[]>();
  for (const path of logs) {
    let text = "";
    try {
      text = readFileSync(path, "utf8");
    } catch {
      continue; // no line logged at all
    }
    for (const line of text.split("\n")) {
      if (!line.includes('"jobPid"')) continue;
      try {
        const j = JSON.parse(line) as { time: number; jobPid: number; signal?: string; error?: string; message?: string };
        const list = out.get(j.jobPid) ?? [];
        list.push({ at: j.time, signal: j.signal, error: j.error, message: j.message });
        out.set(j.jobPid, list);
      } catch {
        /* a line cut by a SIGKILL */
      }
    }
  }
  return out;
}

/** The work dir stays with --keep, or when the check found a violation (the evidence). */
let keepDir = args.keep;

async function main(): Promise<number> {
  const minutes = Number(args.minutes);
  const rate = Number(args.rate);
  if (!(minutes > 0) || !(rate > 0)) throw new Error("--minutes and --rate must be positive numbers");
  const dir = mkdtempSync(join(tmpdir(), "slotbroker-soak-"));
  chmodSync(dir, 0o755); // as root, the embedded Postgres runs as "postgres" and needs to reach pg/
  const ledger = join(dir, "ledger.txt");
  writeFileSync(ledger, "");
  const jobScript = writeJobScript(dir);
  log(`seed ${seed} (rerun with --seed ${seed}); ${minutes} min of chaos at ${rate} items/s; work dir ${dir}`);
  await buildChildren(); // the fleet runs from one build of the project's JavaScript
  let fleet: Fleet | undefined;
  try {
    fleet = await startFleet({ root, dir, runId, jobScript, execservers: 3, fylrs: 3, slotsPerExecserver: 6, logLevel: process.env.SLOTBROKER_LOAD_LOG_LEVEL ?? "error" });
    await query(fleet.databaseUrl, SCHEMA);
    log(`fleet up: ${fleet.fylrs.length} fylrs, ${fleet.execservers.length} execservers (2 behind HAProxy ${fleet.haproxy.address}), proxies ${fleet.proxies.map((p) => p.address).join(" ")}`);

    const watcher = new ExitWatcher(ledger);
    watcher.start();
    const driver = new ChaosDriver(fleet, { rand: chaosRand, meanGapMs: 1500, postgresEveryMs: Number(args["postgres-every-seconds"]) * 1000, log: args.verbose ? log : () => undefined });
    driver.start();
    const chaosEnd = Date.now() + minutes * 60_000;
    const items: SoakItem[] = [];
    const unaccepted: SoakItem[] = [];
    const pending = new Set<Promise<void>>();
    let n = 0;
    let lastProgress = Date.now();
    let backlog = 0;
    let lastBacklogCheck = 0;
    while (Date.now() < chaosEnd) {
      if (Date.now() - lastBacklogCheck > 2_000) {
        lastBacklogCheck = Date.now();
        backlog = await openCount(fleet.databaseUrl).catch(() => backlog);
      }
      if (backlog < Number(args["max-backlog"]) && pending.size < 50) {
        const item = makeItem(runId, n++, rand);
        const p = submit(fleet, item, ledger, chaosEnd + 30_000).then((ok) => void (ok ? items.push(item) : unaccepted.push(item)));
        pending.add(p);
        void p.finally(() => pending.delete(p));
      }
      if (Date.now() - lastProgress > 15_000) {
        lastProgress = Date.now();
        log(`submitted ${n}, open ${backlog}, faults ${JSON.stringify(driver.counts())}`);
      }
      await sleep(1000 / rate);
    }
    log(`chaos over after ${n} submits; healing and draining`);
    await driver.stop();
    await Promise.all(pending);
    // Submits that got no answer may still have reached the database: count them as accepted.
    const keys = await query<{ idempotency_key: string }>(fleet.databaseUrl, `SELECT idempotency_key FROM queue_items WHERE idempotency_key = ANY($1)`, [unaccepted.map((i) => i.tag)]);
    const reached = new Set(keys.map((k) => k.idempotency_key));
    items.push(...unaccepted.filter((i) => reached.has(i.tag)));
    const neverAccepted = unaccepted.length - reached.size;

    const drainEnd = Date.now() + Number(args["drain-seconds"]) * 1000;
    let open = await openCount(fleet.databaseUrl);
    while (open > 0 && Date.now() < drainEnd) {
      await sleep(1_000);
      open = await openCount(fleet.databaseUrl).catch(() => open);
    }
    log(`drained: ${open} items still open`);
    // Slots and wants settle once the last DONE is processed; job processes once killed.
    // Job directories go right after their DONE (and a dead execserver's with it).
    let left = await leftovers(fleet, jobScript);
    let leftDirs = jobDirsUnder(fleet.execTmp);
    for (let i = 0; i < 20 && left.length + leftDirs.length > 0; i++) {
      await sleep(500);
      left = await leftovers(fleet, jobScript);
      leftDirs = jobDirsUnder(fleet.execTmp);
    }

    const rows = await query<FinalRow>(fleet.databaseUrl, `SELECT idempotency_key AS tag, state, attempts, error FROM queue_items`);
    const done = await query<{ tag: string; n: number }>(
      fleet.databaseUrl,
      `SELECT q.idempotency_key AS tag, count(*)::int AS n FROM soak_completions c JOIN queue_items q ON q.id = c.id GROUP BY 1`,
    );
    const gone = watcher.stop();
    // With --keep, the evidence stays in the work dir next to the ledger and the servers' logs.
    writeFileSync(join(dir, "gone.txt"), [...gone].map(([k, at]) => `gone ${k} ${at}\n`).join(""));
    writeFileSync(join(dir, "faults.txt"), driver.events.map((e) => `${JSON.stringify(e)}\n`).join(""));
    let ledgerText = readFileSync(ledger, "utf8");
    const accepted = [...items];
    if (args["inject-violation"]) {
      accepted.push(makeItem(runId, 999_999, rand));
      // A re-run right after a clean run: more executions than claims, and when no fault
      // came near the run (preferred, not always there in a short run), unexplained too.
      const runs = parseLedger(ledgerText);
      const quiet = (from: number, to: number): boolean => !driver.events.some((f) => f.at <= to + 1000 && f.until >= from - 1000);
      const clean = rows.filter((r) => {
        const list = runs.get(r.tag) ?? [];
        return r.state === "succeeded" && list.length === 1 && list[0]!.code === 0 && items.find((i) => i.tag === r.tag)?.mode === "short";
      });
      const victim = clean.find((r) => quiet(runs.get(r.tag)![0]!.start, runs.get(r.tag)![0]!.end! + 300)) ?? clean[0];
      const first = victim && runs.get(victim.tag)![0]!;
      if (first) ledgerText += `start ${first.tag} 1 ${first.execPid} ${first.end! + 100}\nend ${first.tag} 1 ${first.execPid} ${first.end! + 300} 0\n`;
      log(`injected: one accepted item that is not in the database, one extra execution of ${victim?.tag ?? "(none)"}`);
    }
    const execDeaths = new Map<number, number>();
    for (const e of fleet.execservers) for (const [pid, at] of e.deaths) execDeaths.set(pid, at);
    const execPaths = new Map<number, { name: string; proxy: string }>();
    for (const [i, e] of fleet.execservers.entries()) for (const pid of e.pids) execPaths.set(pid, { name: e.name, proxy: fleet.execProxies[i]! });
    const outcomes = readOutcomes(fleet.execLogs);
    const crashes = [...fleet.fylrs, ...fleet.execservers].flatMap((p) =>
      p.crashes.map((c) => `${p.name} pid ${c.pid} (${c.how}) at ${((c.at - started) / 1000).toFixed(1)} s: ${c.tail.split("\n").filter(Boolean).slice(-40).join(" | ").slice(-4000)}`),
    );
        // A crash explains the re-runs it causes (the crash itself is a violation).
    const crashFaults = [...fleet.fylrs, ...fleet.execservers].flatMap((p) => p.crashes.map((c) => ({ at: c.at, until: c.at + 5_000, kind: `crash-${p.name.replace(/-\d+$/, "")}`, target: p.name })));
    const result = check({ items: accepted, rows, completions: new Map(done.map((d) => [d.tag, d.n])), ledger: ledgerText, faults: [...driver.events, ...crashFaults], execDeaths, execPaths, gone, outcomes, crashes, leftovers: left, leftoverJobDirs: leftDirs });
    console.log("\n==> soak result");
    console.log(`seed: ${seed}; chaos ${minutes} min; wall time ${((Date.now() - started) / 1000).toFixed(0)} s; submits never accepted (no fylr answered in time): ${neverAccepted}`);
    for (const line of result.report) console.log(line);
    if (result.violations.length > 0) {
      console.log(`\n==> ${result.violations.length} violations (first 40)`);
      for (const v of result.violations.slice(0, 40)) console.log(`  ${v}`);
      console.log(`rerun with: npm run soak -- --minutes ${args.minutes} --rate ${args.rate} --seed ${seed}`);
    }
    if (result.violations.length > 0) {
      keepDir = true;
      console.log(`evidence kept in ${dir}: ledger.txt, gone.txt (exit watcher), faults.txt, execserver-*.log, fylr-*.log`);
    }
    return result.violations.length > 0 ? 1 : 0;
  } finally {
    await fleet?.stop().catch((err: unknown) => console.error(`stopping the fleet: ${(err as Error).message}`));
    const swept = sweepLeftovers(runId);
    if (swept.length > 0) console.error(`killed leftover processes of this run: ${swept.join("; ")}`);
    for (const pid of strays) {
      try {
        process.kill(pid, "SIGKILL");
      } catch {
        /* gone */
      }
    }
    if (!keepDir) rmSync(dir, { recursive: true, force: true, maxRetries: 5 });
  }
}

main().then(
  (code) => {
    removeBuild();
    process.exit(code);
  },
  (err: unknown) => {
    console.error(`soak failed: ${(err as Error).stack ?? String(err)} (seed ${seed})`);
    process.exit(2);
  },
);
