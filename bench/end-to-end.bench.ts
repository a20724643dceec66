// end-to-end: an item's whole trip, against what a user would build instead, in one run.
//
//   slotbroker       two fylrs (bench/lib/e2e-fylr.ts: the real fylr, each its own process)
//                    and two execservers (the CLI, SLOTS slots each) on one Postgres: Submit
//                    through QueueService (Connect over HTTP, alternating fylrs) → claim →
//                    WANT/OFFER/JOB → stdin pipe → the command → stdout → DONE → settle.
//   slotbroker-traced the same, with traces on in its two fylrs and two execservers (their own
//                    processes and database): every item traced (the default sampler), the
//                    spans exported over OTLP/HTTP to a local OpenTelemetry Collector receiver
//                    (harness/otlp-receiver.ts, built with Go). Against slotbroker it shows
//                    what tracing costs (items_per_s_traced).
//   graphile-worker  two workers (bench/lib/e2e-graphile.ts, each its own process, SLOTS
//                    concurrency each, so the same total) on the same Postgres server (its
//                    own database), whose task spawns the same command with the same stdin.
//                    Jobs are added with WorkerUtils.addJob.
//   floor            the two-process shape from bare parts: two apps (bench/lib/e2e-floor-app.ts:
//                    HTTP submit → graphile-worker, whose task sends the job over a raw gRPC
//                    stream) and two exec processes (e2e-floor-exec.ts: spawn, reply the exit
//                    code), on a database of its own. Against graphile-worker it shows what the
//                    shape costs by itself; slotbroker against it, what slotbroker adds.
//
// Two tiny services: `true` (nothing in, nothing out) and `sha256sum` of 4 KiB of stdin.
// Per system and service:
//   throughput  ITEMS items submitted by 16 concurrent submitters; items/s from the first
//               submit to the last settle.
//   latency     LATENCY_ITEMS items, two at a time (one submitter per fylr/worker), each
//               waiting for its item to settle: submit → settled (the result written).
// Stages of the latency items (the slotbroker fylr's lifecycle events, the worker's
// job:start/job:complete; epoch clocks of the processes): submit → committed (Submit
// returned) → claimed → waiting (WANT parked) → running (OFFER came, JOB sent) → finishing
// (DONE came, stdout collected) → settled. Medians are printed and go into params.
// Before the rounds every system runs WARMUP items per service under the throughput load
// (and 20 latency items), unmeasured: V8 is still compiling hot functions for the first
// thousand items or so, and CPU per item is meant to be what a running system spends, not
// its start-up. Rounds alternate which system goes first. With E2E_TIMELINE=1 the fylrs also say when each
// Submit request came in and when its answer was written, and submit → committed of the
// latency items is split into submit → fylr request (the client and the way there), fylr
// request → answer (the fylr) and answer → committed (the way back and the client).
//
//   npm run bench -- end-to-end     E2E_ITEMS=300 E2E_LATENCY_ITEMS=100 E2E_ROUNDS=2 E2E_SLOTS=4 E2E_WARMUP=300 E2E_TIMELINE=
//
// Children run as plain JavaScript from the run's build (harness/node-children.ts; E2E_RUNTIME=tsx: through tsx).
// Node flags: BENCH_CHILD_NODE_ARGS go to every child; E2E_EXEC_NODE_ARGS to the two
// execservers alone, e.g. E2E_EXEC_NODE_ARGS="--cpu-prof --cpu-prof-dir=/tmp/prof/exec" profiles
// them without slowing the fylrs and workers; E2E_FYLR_NODE_ARGS to the two fylrs alone. Each
// profile is summarised with `npx tsx bench/profile-summary.ts FILE.cpuprofile`.
//
// E2E_SYSTEMS=slotbroker,slotbroker-traced runs only the systems named (default: all four);
// a figure is emitted only when both of its systems ran.
//
// Postgres: DATABASE_URL when set, else an embedded server in a temp dir.
import { randomBytes } from "node:crypto";
import { chmodSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { performance } from "node:perf_hooks";
import { fileURLToPath } from "node:url";
import type { ChildProcess } from "node:child_process";
import { Agent, request } from "node:http";
import { makeWorkerUtils, runMigrations, type WorkerUtils } from "graphile-worker";
import { createQueueClient, type QueueClient } from "../src/api/client.js";
import { migrate } from "../src/dispatcher/index.js";
import { startEmbeddedPostgres, type LocalPostgres } from "../src/shared/embedded-postgres.js";
import { createDatabase } from "../harness/databases.js";
import { Trips, stageMedians, type Trip } from "./lib/e2e-trips.js";
import { emit, percentile } from "./lib/figure.js";
import { CpuMeter, postgresBackends, withLiveChildren } from "./lib/proc-cpu.js";
import { BUILD_ENV, buildChildren } from "../harness/node-children.js";
import { startChild } from "./lib/raw-grpc.js";
import { startOtlpReceiver, type OtlpReceiver } from "../harness/otlp-receiver.js";

const items = Number(process.env.E2E_ITEMS ?? 300);
const latencyItems = Number(process.env.E2E_LATENCY_ITEMS ?? 100);
const rounds = Number(process.env.E2E_ROUNDS ?? 2);
const warmup = Number(process.env.E2E_WARMUP ?? 300);
const slots = Number(process.env.E2E_SLOTS ?? 4);
const submitters = 16;
// Children of both systems run as plain JavaScript (as deployed) unless E2E_RUNTIME=tsx.
const runtime = process.env.E2E_RUNTIME === "tsx" ? "tsx" : "compiled";

const here = dirname(fileURLToPath(import.meta.url));
const cli = join(here, "..", "src", "cli.ts");
const note = (text: string): void => void process.stderr.write(`end-to-end: ${text}\n`);
const epochMs = (): number => performance.timeOrigin + performance.now();

type System = "slotbroker" | "slotbroker-traced" | "graphile-worker" | "floor";
// floor: graphile-worker with an HTTP submit and the spawn moved into a second process (see
// e2e-floor-app.ts): the two-process shape built from bare parts, without slotbroker.
const allSystems: readonly System[] = ["slotbroker", "slotbroker-traced", "graphile-worker", "floor"];
const systems = systemsFrom(process.env.E2E_SYSTEMS);

function systemsFrom(value: string | undefined): readonly System[] {
  if (!value?.trim()) return allSystems;
  const named = value.split(",").map((s) => s.trim());
  for (const name of named) if (!allSystems.includes(name as System)) throw new Error(`E2E_SYSTEMS: unknown system "${name}" (known: ${allSystems.join(", ")})`);
  return allSystems.filter((s) => named.includes(s));
}
type Service = "true" | "sha256";
const stdin4k = randomBytes(4096);

interface Stack {
  /** Resolves once the submit is answered; `done` once the item settled. */
  submit(service: Service, lane: number): Promise<{ done: Promise<Trip> }>;
}

function slotbrokerStack(clients: QueueClient[], trips: Trips): Stack {
  return {
    async submit(service, lane) {
      const call = service === "true" ? { service } : { service, stdin: { case: "stdinData" as const, value: stdin4k } };
      const trip: Trip = { submit: epochMs(), fylr: lane % clients.length };
      const res = await clients[lane % clients.length]!.submit({ calls: [call] });
      trip.committed = epochMs();
      return { done: trips.wait(res.item!.id, trip) };
    },
  };
}

function graphileStack(utils: WorkerUtils, trips: Trips): Stack {
  const payloads = {
    true: { command: ["true"], stdin: "" },
    sha256: { command: ["sha256sum"], stdin: stdin4k.toString("base64") },
  };
  return {
    async submit(service) {
      const trip: Trip = { submit: epochMs() };
      const job = await utils.addJob("exec", payloads[service]);
      trip.committed = epochMs();
      return { done: trips.wait(job.id, trip) };
    },
  };
}

/** Submits over HTTP to the floor's application processes (e2e-floor-app.ts), alternating. */
function floorStack(urls: string[], trips: Trips): Stack {
  const agent = new Agent({ keepAlive: true });
  const bodies = { true: JSON.stringify({ service: "true" }), sha256: JSON.stringify({ service: "sha256", stdin: stdin4k.toString("base64") }) };
  const post = (url: string, body: string): Promise<{ id: string }> =>
    new Promise((resolve, reject) => {
      const req = request(`${url}/submit`, { method: "POST", agent, headers: { "content-type": "application/json" } }, (res) => {
        const chunks: Buffer[] = [];
        res.on("data", (c: Buffer) => chunks.push(c));
        res.on("end", () => (res.statusCode === 200 ? resolve(JSON.parse(Buffer.concat(chunks).toString()) as { id: string }) : reject(new Error(`floor submit: ${res.statusCode}`))));
      });
      req.on("error", reject);
      req.end(body);
    });
  return {
    async submit(service, lane) {
      const trip: Trip = { submit: epochMs() };
      const { id } = await post(urls[lane % urls.length]!, bodies[service]);
      trip.committed = epochMs();
      return { done: trips.wait(String(id), trip) };
    },
  };
}

async function throughput(stack: Stack, service: Service, n: number): Promise<{ rate: number; trips: Trip[] }> {
  let next = 0;
  const pending: Promise<Trip>[] = [];
  const t0 = epochMs();
  await Promise.all(
    Array.from({ length: submitters }, async (_, lane) => {
      while (next < n) {
        next++;
        pending.push((await stack.submit(service, lane)).done);
      }
    }),
  );
  const done = await Promise.all(pending);
  const last = Math.max(...done.map((t) => t.settled!));
  return { rate: n / ((last - t0) / 1000), trips: done };
}

async function latency(stack: Stack, service: Service, n: number): Promise<Trip[]> {
  const trips: Trip[] = [];
  await Promise.all(
    [0, 1].map(async (lane) => {
      for (let i = lane; i < n; i += 2) trips.push(await (await stack.submit(service, lane)).done);
    }),
  );
  return trips;
}

function round2(ms: Record<string, number>, per: number): Record<string, number> {
  return Object.fromEntries(Object.entries(ms).map(([k, v]) => [k, Math.round((v / per) * 100) / 100]));
}

async function main(): Promise<void> {
  const dir = mkdtempSync(join(tmpdir(), "bench-end-to-end-"));
  chmodSync(dir, 0o755); // as root the embedded server runs as the "postgres" user
  let server: LocalPostgres | undefined;
  const children: ChildProcess[] = [];
  let utils: WorkerUtils | undefined;
  let collector: OtlpReceiver | undefined;
  try {
    const adminUrl = process.env.DATABASE_URL ?? (server = await startEmbeddedPostgres({ dataDir: join(dir, "pg"), persistent: false })).url;
    const sbDb = await createDatabase(adminUrl, "e2e_slotbroker");
    const tracedDb = await createDatabase(adminUrl, "e2e_traced");
    const gwDb = await createDatabase(adminUrl, "e2e_graphile");
    const floorDb = await createDatabase(adminUrl, "e2e_floor");
    const [sbUrl, gwUrl] = [sbDb.url, gwDb.url];
    await migrate(sbUrl);
    await migrate(tracedDb.url);
    await runMigrations({ connectionString: gwUrl, logger: undefined });
    await runMigrations({ connectionString: floorDb.url, logger: undefined });
    if (runtime === "tsx") delete process.env[BUILD_ENV];
    else if (!process.env[BUILD_ENV]) await buildChildren({ bundle: false });
    const execConfig = join(dir, "exec.yaml");
    writeFileSync(
      execConfig,
      `listen: 127.0.0.1:0\nadminListen: 127.0.0.1:0\nwaitgroups: {w: {processes: ${slots}}}\n` +
        `services: {"true": {waitgroup: w, command: ["true"]}, sha256: {waitgroup: w, command: ["sha256sum"]}}\n`,
    );
    collector = await startOtlpReceiver();
    // Batches go out every 500 ms (the SDK's default is 5 s), so their export falls inside
    // the throughput phase it belongs to and is counted there.
    const otel = { OTEL_TRACES_EXPORTER: "otlp", OTEL_EXPORTER_OTLP_ENDPOINT: collector.endpoint, OTEL_BSP_SCHEDULE_DELAY: "500" };
    const startExecs = async (env?: NodeJS.ProcessEnv) => {
      const started = await Promise.all([0, 1].map(() => startChild([cli, "execserver", "--config", execConfig], undefined, process.env.E2E_EXEC_NODE_ARGS, env)));
      children.push(...started.map((e) => e.child));
      return started;
    };
    const startFylrs = async (prefix: string, databaseUrl: string, to: { address: string }[], trips: Trips, env?: NodeJS.ProcessEnv) => {
      const started = await Promise.all(
        [`${prefix}-a`, `${prefix}-b`].map((name) =>
          startChild(
            [join(here, "lib", "e2e-fylr.ts"), JSON.stringify({ name, listen: "127.0.0.1:0", databaseUrl, execserver: { addresses: to.map((e) => e.address) } })],
            /url=(\S+)/,
            process.env.E2E_FYLR_NODE_ARGS,
            env,
          ),
        ),
      );
      for (const [index, f] of started.entries()) {
        children.push(f.child);
        trips.follow(f.child, "item", index);
      }
      return started;
    };
    const execs = await startExecs();
    const trips = new Trips();
    const fylrs = await startFylrs("e2e", sbUrl, execs, trips);
    const tracedExecs = await startExecs(otel);
    const tracedTrips = new Trips();
    const tracedFylrs = await startFylrs("e2e-traced", tracedDb.url, tracedExecs, tracedTrips, otel);
    const workers = await Promise.all([0, 1].map(() => startChild([join(here, "lib", "e2e-graphile.ts"), gwUrl, String(slots)], /e2e-graphile (ready)/)));
    for (const w of workers) {
      children.push(w.child);
      trips.follow(w.child, "job");
    }
    const floorExecs = await Promise.all([0, 1].map(() => startChild([join(here, "lib", "e2e-floor-exec.ts")], undefined)));
    children.push(...floorExecs.map((e) => e.child));
    const floorApps = await Promise.all(
      [0, 1].map(() => startChild([join(here, "lib", "e2e-floor-app.ts"), floorDb.url, String(slots), floorExecs.map((e) => e.address).join(",")], /url=(\S+)/)),
    );
    const floorTrips = new Trips(); // its job ids overlap graphile-worker's
    for (const a of floorApps) {
      children.push(a.child);
      floorTrips.follow(a.child, "job");
    }
    utils = await makeWorkerUtils({ connectionString: gwUrl });
    const stacks: Record<System, Stack> = {
      slotbroker: slotbrokerStack(
        fylrs.map((f) => createQueueClient(f.address)),
        trips,
      ),
      "slotbroker-traced": slotbrokerStack(
        tracedFylrs.map((f) => createQueueClient(f.address)),
        tracedTrips,
      ),
      "graphile-worker": graphileStack(utils, trips),
      floor: floorStack(
        floorApps.map((a) => a.address),
        floorTrips,
      ),
    };
    const pids = (list: { child: ChildProcess }[]) => () => list.map((c) => c.child.pid!);
    const meters: Record<System, CpuMeter> = {
      slotbroker: new CpuMeter({ fylrs: pids(fylrs), execservers: () => withLiveChildren(pids(execs)()), postgres: () => postgresBackends(sbDb.name) }),
      "slotbroker-traced": new CpuMeter({
        fylrs: pids(tracedFylrs),
        execservers: () => withLiveChildren(pids(tracedExecs)()),
        postgres: () => postgresBackends(tracedDb.name),
        collector: () => [collector!.child.pid!],
      }),
      "graphile-worker": new CpuMeter({ workers: pids(workers), postgres: () => postgresBackends(gwDb.name) }),
      floor: new CpuMeter({ apps: pids(floorApps), execs: () => withLiveChildren(pids(floorExecs)()), postgres: () => postgresBackends(floorDb.name) }),
    };
    note(`warm-up: ${warmup} items per system and service (2 execservers × ${slots} slots, 2 fylrs; 2 workers × concurrency ${slots})`);
    for (const system of systems) {
      for (const service of ["true", "sha256"] as const) {
        await latency(stacks[system], service, 20);
        if (warmup > 0) await throughput(stacks[system], service, warmup);
      }
    }
    trips.timeline([]); // the warm-up's answers
    tracedTrips.timeline([]);
    const tripsOf = (system: System): Trips => (system === "slotbroker-traced" ? tracedTrips : trips);
    const rates: Record<string, number[]> = {};
    const lat: Record<string, Trip[]> = {};
    const cpu: Record<string, Record<string, number>> = {};
    for (let r = 0; r < rounds; r++) {
      const order = r % 2 === 0 ? systems : [...systems].reverse();
      for (const service of ["true", "sha256"] as const) {
        for (const system of order) {
          const key = `${system}/${service}`;
          const n = Math.ceil(items / rounds);
          meters[system].start();
          const { rate, trips: loaded } = await throughput(stacks[system], service, n);
          const spent = meters[system].stop();
          const perItem = (cpu[key] ??= {});
          for (const [part, ms] of Object.entries(spent)) perItem[part] = (perItem[part] ?? 0) + ms / n / rounds;
          tripsOf(system).timeline([]); // the throughput load's answers
          const got = await latency(stacks[system], service, Math.ceil(latencyItems / rounds));
          tripsOf(system).timeline(got);
          (rates[key] ??= []).push(rate);
          (lat[key] ??= []).push(...got);
          const sorted = got.map((t) => t.settled! - t.submit).sort((x, y) => x - y);
          note(`round ${r + 1} ${key}: ${rate.toFixed(0)} items/s, latency p50 ${percentile(sorted, 50).toFixed(1)} ms p99 ${percentile(sorted, 99).toFixed(1)} ms`);
          note(`  stage medians under the throughput load (ms): ${JSON.stringify(stageMedians(loaded))}`);
          note(`  CPU ms per item (processes with the commands they ran; Postgres backends of its database): ${JSON.stringify(round2(spent, n))}`);
        }
      }
    }
    for (const service of ["true", "sha256"] as const) {
      const prefix = service === "true" ? "" : "sha256_";
      const what = service === "true" ? "`true`, no input" : "`sha256sum` of 4 KiB stdin";
      const rate = (s: System): number => rates[`${s}/${service}`]!.reduce((a, b) => a + b, 0) / rounds;
      const params = { service: what, slots: 2 * slots, items, latency_items: latencyItems, rounds, warmup, fylrs: 2, execservers: 2, workers: 2, runtime };
      const ran = (a: System, b: System): boolean => systems.includes(a) && systems.includes(b);
      const sorted = (s: System): number[] => lat[`${s}/${service}`]!.map((t) => t.settled! - t.submit).sort((x, y) => x - y);
      if (ran("slotbroker", "graphile-worker")) {
        emit({
          bench: "end-to-end",
          metric: `${prefix}items_per_s`,
          value: rate("slotbroker"),
          baseline: "graphile-worker, task spawns the same command, same concurrency, same Postgres",
          baseline_value: rate("graphile-worker"),
          params: {
            ...params,
            better: "higher",
            goal: "≥ 1.0",
            cpu_ms_per_item: { slotbroker: round2(cpu[`slotbroker/${service}`]!, 1), graphile: round2(cpu[`graphile-worker/${service}`]!, 1) },
          },
        });
        const stages = { slotbroker: stageMedians(lat[`slotbroker/${service}`]!), graphile: stageMedians(lat[`graphile-worker/${service}`]!) };
        note(`${service} stage medians (ms): slotbroker ${JSON.stringify(stages.slotbroker)}`);
        note(`${service} stage medians (ms): graphile-worker ${JSON.stringify(stages.graphile)}`);
        for (const p of [50, 99]) {
          emit({
            bench: "end-to-end",
            metric: `${prefix}latency_p${p}_ms`,
            value: percentile(sorted("slotbroker"), p),
            baseline: "graphile-worker, submit → result written",
            baseline_value: percentile(sorted("graphile-worker"), p),
            params: { ...params, better: "lower", goal: p === 50 ? "< 1.0" : undefined, stage_medians_ms: p === 50 ? stages : undefined },
          });
        }
      }
      // The floor against graphile-worker (what the two-process shape costs by itself), and
      // slotbroker against the floor (what slotbroker costs on top of that shape).
      const floorBaseline = "the floor: graphile-worker + HTTP submit + spawn in a second process over raw gRPC";
      if (ran("floor", "graphile-worker")) {
        const floorCpu = round2(cpu[`floor/${service}`]!, 1);
        note(`${service} floor stage medians (ms): ${JSON.stringify(stageMedians(lat[`floor/${service}`]!))}`);
        emit({
          bench: "end-to-end",
          metric: `${prefix}floor_items_per_s`,
          value: rate("floor"),
          baseline: "graphile-worker, task spawns the same command, same concurrency, same Postgres",
          baseline_value: rate("graphile-worker"),
          params: { ...params, better: "higher", cpu_ms_per_item: { floor: floorCpu } },
        });
      }
      if (ran("slotbroker-traced", "slotbroker")) {
        emit({
          bench: "end-to-end",
          metric: `${prefix}items_per_s_traced`,
          value: rate("slotbroker-traced"),
          baseline: "slotbroker with traces off, same run",
          baseline_value: rate("slotbroker"),
          params: {
            ...params,
            better: "higher",
            goal: service === "true" ? "≥ 0.9" : undefined,
            sampler: "parentbased_always_on (every item)",
            exporter: "OTLP/HTTP protobuf to a local collector receiver, batches every 500 ms",
            cpu_ms_per_item: { traced: round2(cpu[`slotbroker-traced/${service}`]!, 1), off: round2(cpu[`slotbroker/${service}`]!, 1) },
          },
        });
      }
      if (ran("slotbroker", "floor")) {
        emit({ bench: "end-to-end", metric: `${prefix}items_per_s_vs_floor`, value: rate("slotbroker"), baseline: floorBaseline, baseline_value: rate("floor"), params: { ...params, better: "higher" } });
      }
      if (ran("floor", "graphile-worker")) {
        for (const p of [50, 99]) {
          emit({
            bench: "end-to-end",
            metric: `${prefix}floor_latency_p${p}_ms`,
            value: percentile(sorted("floor"), p),
            baseline: "graphile-worker, submit → result written",
            baseline_value: percentile(sorted("graphile-worker"), p),
            params: { ...params, better: "lower" },
          });
        }
      }
    }
    note(`the collector received ${collector.spans().length} spans`);
  } finally {
    await utils?.release();
    await collector?.stop();
    for (const child of children) child.kill("SIGTERM");
    await Promise.all(children.map((c) => (c.exitCode !== null ? Promise.resolve() : new Promise<void>((r) => c.once("exit", () => r())))));
    await server?.stop();
    rmSync(dir, { recursive: true, force: true });
  }
}

await main();
