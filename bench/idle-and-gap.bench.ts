// idle-and-gap: the broker against the pre-broker token-polling transport, on the same two
// execservers (the real CLI, each its own process, broker mode with the legacy port on) and
// the same work. The broker side is the fylr's broker client with its exec client and
// pipes; the polling side is the old client (LegacyClient): GET /token on every execserver
// once a second per waiting job, then PUT /job. Rounds alternate the two (B P P B B P); each
// pair of rounds gets the same arrival offsets.
//
// Counted at the execservers from their /metrics (frames received; legacy requests):
//   idle_requests_per_s  requests/s while nothing changes: every slot busy with a long job
//                        and `waiting` more jobs waiting. Liveness Pings of the broker
//                        streams are not requests for work; they are reported in params.
//   requests_per_job     requests per job while a backlog of short jobs is worked off.
//   gap_p50_ms/gap_p99_ms  slot idle gap while a job waits (a slot freeing → the waiting
//                        job running in it), with one job waiting at a time: every slot runs
//                        a job of 1–2 s, and whenever the waiting job gets a slot the next one
//                        arrives. From the execservers' slot_idle_gap histogram (quantiles
//                        interpolated within buckets; the exact mean is in params).
//   backlog_gap_p50_ms/…p99  the same gap under the deep backlog: many waiting pollers
//                        sample a freed slot sooner, at the price of their requests.
// value = broker, baseline = polling, ratio = broker ÷ polling; lower is better for all.
//   npm run bench -- idle-and-gap
import { spawn, type ChildProcess } from "node:child_process";
import { setMaxListeners } from "node:events";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { stringify } from "yaml";
import { BrokerClient, compileBrokerConfig, ExecClient, LegacyClient, PipeRegistry, startFylrHttpServer } from "../src/fylr/index.js";
import { waitForOutput } from "../harness/child-output.js";
import { add, delta, quantileMs, scrape, zero, type Counts } from "./lib/exec-metrics.js";
import { emit } from "./lib/figure.js";
import { nodeScript } from "../harness/node-children.js";

const slotsPerExec = 4;
const longJobS = 5;
const idleWindowMs = 3_000;
const waitingInIdle = 4;
// The backlog: every slot busy with a blocker job, and `backlogJobs` more arriving while
// they run, each waiting for its own slot (polling at its own phase).
const blockerS = 1.5;
const backlogJobs = 32;
const arrivalSpreadMs = 900;
const shortJobS = 0.5;
// Longer than the execserver's gap cut-off (3 s): slots freed by one phase are not matched
// with the next phase's first jobs.
const quietMs = 3_500;
// One job waiting at a time: `oneWaiterJobs` jobs of 1–2 s each.
const oneWaiterJobs = 48;
const rounds: Transport[] = ["broker", "polling", "polling", "broker"];

type Transport = "broker" | "polling";

interface Exec {
  readonly child: ChildProcess;
  readonly grpc: string;
  readonly admin: string;
}

async function startExec(dir: string, name: string): Promise<Exec> {
  const config = join(dir, `${name}.yaml`);
  writeFileSync(
    config,
    stringify({
      instanceId: name,
      listen: "127.0.0.1:0",
      adminListen: "127.0.0.1:0",
      legacy: { enabled: true },
      waitgroups: { work: { processes: slotsPerExec } },
      services: { sleep: { waitgroup: "work", command: ["sleep"] } },
    }),
  );
  const cli = join(fileURLToPath(import.meta.url), "..", "..", "src", "cli.ts");
  const child = spawn(process.execPath, [...nodeScript(cli), "execserver", "--config", config], { stdio: ["ignore", "pipe", "inherit"] });
  const m = await waitForOutput(child, /listening grpc=(\S+) admin=(\S+)/, { timeoutMs: 60_000 });
  return { child, grpc: m[1]!, admin: m[2]! };
}

/** Runs one job on the given transport; `onStart` when it got its slot. */
type RunOne = (seconds: number, signal?: AbortSignal, onStart?: () => void) => Promise<void>;

async function waitUntil(what: string, check: () => Promise<boolean>, timeoutMs = 30_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!(await check())) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 25));
  }
}

async function running(execs: readonly Exec[]): Promise<number> {
  let n = 0;
  for (const exec of execs) {
    const status = (await (await fetch(`http://${exec.admin}/status.json`)).json()) as { waitgroups: { running?: number }[] };
    n += status.waitgroups[0]?.running ?? 0;
  }
  return n;
}

/** Every slot busy with a long job and `waitingInIdle` more waiting: requests counted over a window. */
async function idlePhase(execs: readonly Exec[], run: RunOne): Promise<{ counts: Counts; seconds: number }> {
  const slots = slotsPerExec * execs.length;
  const stop = new AbortController();
  setMaxListeners(0, stop.signal);
  const jobs = Array.from({ length: slots + waitingInIdle }, () => run(longJobS, stop.signal).catch(() => undefined));
  await waitUntil("every slot running", async () => (await running(execs)) === slots);
  // Let the waiting jobs settle into their steady state (parked, or polling).
  await new Promise((r) => setTimeout(r, 300));
  const before = await scrape(execs.map((e) => e.admin));
  const start = performance.now();
  await new Promise((r) => setTimeout(r, idleWindowMs));
  const counts = delta(await scrape(execs.map((e) => e.admin)), before);
  const seconds = (performance.now() - start) / 1000;
  stop.abort();
  await Promise.all(jobs);
  await waitUntil("the slots to drain", async () => (await running(execs)) === 0);
  return { counts, seconds };
}

/**
 * Every slot busy with a blocker job; meanwhile `backlogJobs` short jobs arrive over
 * `arrivalSpreadMs` (the same offsets for both transports), each waiting for its own slot
 * as a queue item's exec call does. Every slot that frees while jobs wait is a gap sample.
 */
async function backlogPhase(execs: readonly Exec[], run: RunOne, offsets: readonly number[]): Promise<{ counts: Counts; seconds: number; jobs: number }> {
  const slots = slotsPerExec * execs.length;
  const before = await scrape(execs.map((e) => e.admin));
  const start = performance.now();
  const blockers = Array.from({ length: slots }, () => run(blockerS));
  await waitUntil("every slot running a blocker", async () => (await running(execs)) === slots);
  const queued = offsets.map(async (offset) => {
    await new Promise((r) => setTimeout(r, offset));
    await run(shortJobS);
  });
  await Promise.all([...blockers, ...queued]);
  const seconds = (performance.now() - start) / 1000;
  return { counts: delta(await scrape(execs.map((e) => e.admin)), before), seconds, jobs: slots + offsets.length };
}

/** No work at all. */
async function quietPhase(execs: readonly Exec[]): Promise<{ counts: Counts; seconds: number }> {
  const before = await scrape(execs.map((e) => e.admin));
  const start = performance.now();
  await new Promise((r) => setTimeout(r, quietMs));
  return { counts: delta(await scrape(execs.map((e) => e.admin)), before), seconds: (performance.now() - start) / 1000 };
}

// A small deterministic PRNG (mulberry32), so both transports get the same work.
function randoms(seed: number, n: number): number[] {
  let a = seed;
  const random = (): number => {
    a = (a + 0x6d2b79f5) | 0;
    let t = Math.imul(a ^ (a >>> 15), 1 | a);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
  return Array.from({ length: n }, random);
}

function offsetsFor(seed: number): number[] {
  return randoms(seed, backlogJobs)
    .map((r) => Math.floor(r * arrivalSpreadMs))
    .sort((x, y) => x - y);
}

/**
 * One job waiting at a time: every slot busy, and whenever the waiting job gets its slot
 * the next one arrives (so it starts polling, or parks, at a moment unrelated to when the
 * next slot frees). Every slot that frees meets exactly one waiting job.
 */
async function oneWaiterPhase(execs: readonly Exec[], run: RunOne, seed: number): Promise<{ counts: Counts; seconds: number; jobs: number }> {
  const slots = slotsPerExec * execs.length;
  const durations = randoms(seed, slots + oneWaiterJobs).map((r) => Math.round((1 + r) * 100) / 100);
  const before = await scrape(execs.map((e) => e.admin));
  const start = performance.now();
  const jobs: Promise<void>[] = [];
  let launched = 0;
  let waiting = 0;
  const launch = (): void => {
    const seconds = durations[launched++]!;
    waiting++;
    jobs.push(
      run(seconds, undefined, () => {
        waiting--;
        if (waiting === 0 && launched < durations.length) launch();
      }),
    );
  };
  for (let i = 0; i <= slots; i++) launch();
  // Jobs are launched as others start; wait until the last one was, then for all of them.
  const deadline = Date.now() + 180_000;
  while (launched < durations.length) {
    if (Date.now() > deadline) throw new Error(`one-waiter phase stuck after ${launched} jobs`);
    await new Promise((r) => setTimeout(r, 50));
  }
  await Promise.all(jobs);
  const seconds = (performance.now() - start) / 1000;
  return { counts: delta(await scrape(execs.map((e) => e.admin)), before), seconds, jobs: durations.length };
}

async function main(): Promise<void> {
  const dir = mkdtempSync(join(tmpdir(), "bench-idle-gap-"));
  const execs = [await startExec(dir, "exec-a"), await startExec(dir, "exec-b")];
  const broker = new BrokerClient(
    compileBrokerConfig({ addresses: execs.map((e) => e.grpc), clientName: "bench-fylr", connectTimeout: "60s", polling: { enabled: false } }),
  );
  broker.start();
  const pipes = new PipeRegistry();
  const http = await startFylrHttpServer({ listen: "127.0.0.1:0", registry: pipes });
  const exec = new ExecClient({ broker, pipes, pipePort: http.port });
  const legacy = new LegacyClient({ endpoints: execs.map((e) => ({ url: new URL(`http://${e.admin}`) })), pollIntervalMs: 1000, connectTimeoutMs: 60_000 });
  const runners: Record<Transport, RunOne> = {
    broker: async (seconds, signal, onStart) => {
      const r = await exec.run({ service: "sleep", args: [String(seconds)], signal, onStart: onStart && (() => onStart()) });
      if (r.receipt.exitCode !== 0 && !signal?.aborted) throw new Error(`job failed: ${r.receipt.errorMessage}`);
    },
    polling: async (seconds, signal, onStart) => {
      const r = await legacy.run({ service: "sleep", args: [String(seconds)], signal, onStart: onStart && (() => onStart()) });
      if (r.receipt.exitCode !== 0 && !signal?.aborted) throw new Error(`job failed: ${r.receipt.errorMessage}`);
    },
  };
  try {
    while (broker.instances().length < 2) await new Promise((r) => setTimeout(r, 20));
    type Totals = { idle: Counts; idleS: number; one: Counts; oneS: number; oneJobs: number; backlog: Counts; backlogS: number; jobs: number; quiet: Counts; quietS: number };
    const fresh = (): Totals => ({ idle: zero(), idleS: 0, one: zero(), oneS: 0, oneJobs: 0, backlog: zero(), backlogS: 0, jobs: 0, quiet: zero(), quietS: 0 });
    const totals: Record<Transport, Totals> = { broker: fresh(), polling: fresh() };
    // Each pair of rounds (one per transport) gets the same arrivals.
    for (const [i, transport] of rounds.entries()) {
      process.stderr.write(`  round ${i + 1}/${rounds.length}: ${transport}\n`);
      const t = totals[transport];
      const idle = await idlePhase(execs, runners[transport]);
      t.idle = add(t.idle, idle.counts);
      t.idleS += idle.seconds;
      const quiet = await quietPhase(execs);
      t.quiet = add(t.quiet, quiet.counts);
      t.quietS += quiet.seconds;
      const one = await oneWaiterPhase(execs, runners[transport], 10 + Math.floor(i / 2));
      t.one = add(t.one, one.counts);
      t.oneS += one.seconds;
      t.oneJobs += one.jobs;
      await quietPhase(execs);
      const backlog = await backlogPhase(execs, runners[transport], offsetsFor(1 + Math.floor(i / 2)));
      t.backlog = add(t.backlog, backlog.counts);
      t.backlogS += backlog.seconds;
      t.jobs += backlog.jobs;
    }
    const requests = (c: Counts): number => c.frames + c.legacy;
    const per = Object.fromEntries(
      (["broker", "polling"] as const).map((tr) => {
        const t = totals[tr];
        const jobs = t.jobs;
        return [
          tr,
          {
            idlePerS: requests(t.idle) / t.idleS,
            pingsPerS: t.idle.pings / t.idleS,
            quietPerS: requests(t.quiet) / t.quietS,
            perJob: requests(t.backlog) / jobs,
            jobsPerS: jobs / t.backlogS,
            p50: quantileMs(t.one.gapBuckets, 0.5),
            p99: quantileMs(t.one.gapBuckets, 0.99),
            meanMs: t.one.gapCount === 0 ? 0 : (t.one.gapSum / t.one.gapCount) * 1000,
            gaps: t.one.gapCount,
            oneJobsPerS: t.oneJobs / t.oneS,
            backlogP50: quantileMs(t.backlog.gapBuckets, 0.5),
            backlogP99: quantileMs(t.backlog.gapBuckets, 0.99),
            backlogMeanMs: t.backlog.gapCount === 0 ? 0 : (t.backlog.gapSum / t.backlog.gapCount) * 1000,
            backlogGaps: t.backlog.gapCount,
          },
        ];
      }),
    ) as Record<
      Transport,
      {
        idlePerS: number;
        pingsPerS: number;
        quietPerS: number;
        perJob: number;
        jobsPerS: number;
        p50: number;
        p99: number;
        meanMs: number;
        gaps: number;
        oneJobsPerS: number;
        backlogP50: number;
        backlogP99: number;
        backlogMeanMs: number;
        backlogGaps: number;
      }
    >;
    const b = per.broker;
    const p = per.polling;
    const params = {
      execservers: execs.length,
      slots: slotsPerExec * execs.length,
      rounds: rounds.join(""),
      polling: "LegacyClient: GET /token on each execserver once a second per waiting job, then PUT /job",
      broker: "BrokerClient + ExecClient (pipes), one stream per execserver",
      better: "lower",
    };
    emit({
      bench: "idle-and-gap",
      metric: "idle_requests_per_s",
      value: b.idlePerS,
      baseline: "token polling",
      baseline_value: p.idlePerS,
      params: {
        ...params,
        what: `requests/s to the execservers while every slot runs a ${longJobS} s job and ${waitingInIdle} jobs wait (${idleWindowMs / 1000} s windows)`,
        broker_pings_per_s: round(b.pingsPerS),
        no_work_requests_per_s: { broker: round(b.quietPerS), polling: round(p.quietPerS) },
        goal: "broker 0",
      },
    });
    emit({
      bench: "idle-and-gap",
      metric: "requests_per_job",
      value: b.perJob,
      baseline: "token polling",
      baseline_value: p.perJob,
      params: {
        ...params,
        what: `requests to the execservers per job: every slot busy with a ${blockerS} s job while ${backlogJobs} jobs of ${shortJobS} s arrive within ${arrivalSpreadMs / 1000} s, each waiting on its own`,
        jobs_per_s: { broker: round(b.jobsPerS), polling: round(p.jobsPerS) },
      },
    });
    const gapParams = {
      ...params,
      gaps: { broker: b.gaps, polling: p.gaps },
      mean_ms: { broker: round(b.meanMs), polling: round(p.meanMs) },
      jobs_per_s: { broker: round(b.oneJobsPerS), polling: round(p.oneJobsPerS) },
      goal: "ratio ≤ 0.01",
    };
    const oneWhat = `slot free → the waiting job running, one job waiting at a time (every slot busy with 1–2 s jobs, ${oneWaiterJobs} jobs)`;
    emit({ bench: "idle-and-gap", metric: "gap_p50_ms", value: b.p50, baseline: "token polling", baseline_value: p.p50, params: { ...gapParams, what: `${oneWhat}, p50` } });
    emit({ bench: "idle-and-gap", metric: "gap_p99_ms", value: b.p99, baseline: "token polling", baseline_value: p.p99, params: { ...gapParams, what: `${oneWhat}, p99` } });
    const backlogParams = {
      ...params,
      gaps: { broker: b.backlogGaps, polling: p.backlogGaps },
      mean_ms: { broker: round(b.backlogMeanMs), polling: round(p.backlogMeanMs) },
      what: `slot free → next job running under the backlog of requests_per_job (up to ${backlogJobs} jobs polling at once)`,
    };
    emit({ bench: "idle-and-gap", metric: "backlog_gap_p50_ms", value: b.backlogP50, baseline: "token polling", baseline_value: p.backlogP50, params: backlogParams });
    emit({ bench: "idle-and-gap", metric: "backlog_gap_p99_ms", value: b.backlogP99, baseline: "token polling", baseline_value: p.backlogP99, params: backlogParams });
  } finally {
    await broker.close();
    await http.close();
    pipes.close();
    for (const e of execs) e.child.kill("SIGTERM");
    rmSync(dir, { recursive: true, force: true });
  }
}

function round(n: number): number {
  return Math.round(n * 1000) / 1000;
}

await main();
