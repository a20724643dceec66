// large-item: one file through the whole queue path and back, against plain `cat`.
//
//   queue      `slotbroker submit --service cat --stdin FILE --wait > OUT`: the CLI streams
//              FILE to the fylr's store (POST /queue/inputs → Postgres chunk rows), the
//              fylr's dispatcher claims the item, the execserver's runner GETs the stdin
//              pipe (read back from Postgres with binary COPY) → `cat` → PUTs the stdout
//              pipe (into Postgres), then the CLI streams the output back (GET
//              /queue/items/{id}/output) to OUT. Every part is its own process: CLI, fylr,
//              execserver, Postgres. Timed from the CLI's start to its exit; OUT's SHA-256
//              is checked against FILE's.
//   cat        `cat FILE > OUT`: the floor, the same bytes through one process.
//   pipes      bench/pipe-throughput.bench.ts's own path (in-pipe → runner → cat → out-pipe,
//              no queue, no database), run as a child with the same size, one round.
//
// Figures: MB/s of each path and their ratios; the queue path's time per phase (upload,
// run, download, from the CLI's progress); peak RSS (VmHWM) of the fylr, the execserver
// and the CLI during the queue run, against the 200 MB goal.
//
//   npm run bench -- large-item               LARGE_BENCH_SIZE=1GiB (default); builds dist/ first
//   LARGE_BENCH_SIZE=256MiB npx tsx bench/large-item.bench.ts
//
// Postgres: DATABASE_URL when set, else an embedded server in a temp dir (fsync off).
import { spawn, spawnSync, type ChildProcess } from "node:child_process";
import { createHash, randomBytes } from "node:crypto";
import { chmodSync, closeSync, createReadStream, existsSync, mkdtempSync, openSync, readFileSync, rmSync, writeFileSync, writeSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { stringify } from "yaml";
import { waitForOutput } from "../harness/child-output.js";
import { parseByteSize } from "../src/shared/config-parsing.js";
import { startEmbeddedPostgres, type LocalPostgres } from "../src/shared/embedded-postgres.js";
import { createDatabase } from "../harness/databases.js";
import { emit } from "./lib/figure.js";
import { nodeScript, projectRoot } from "../harness/node-children.js";

const MiB = 1 << 20;
const size = parseByteSize(process.env.LARGE_BENCH_SIZE ?? process.argv[2] ?? "1GiB") ?? 1 << 30;
// The checkout, also when this file runs from the harness's compiled copy under .build/.
const root = projectRoot;
// The shipped build (what `npm install` and the package run), not the sources through tsx:
// tsx's compiler would add ~70 MB to every process's resident memory.
const cli = join(root, "dist", "src", "cli.js");
const note = (text: string): void => void process.stderr.write(`large-item: ${text}\n`);
const params = { bytes: size, unit: "MB/s (1e6 bytes)", better: "higher" };

function peakRss(pid: number | undefined): number {
  if (!pid || !existsSync(`/proc/${pid}/status`)) return 0;
  const m = /VmHWM:\s+(\d+) kB/.exec(readFileSync(`/proc/${pid}/status`, "utf8"));
  return Number(m?.[1] ?? 0) * 1024;
}

/** Polls a process's VmHWM until it exits (the kernel keeps the peak; /proc goes with the process). */
function trackPeak(child: ChildProcess): () => number {
  let peak = 0;
  const timer = setInterval(() => (peak = Math.max(peak, peakRss(child.pid))), 100);
  child.once("exit", () => clearInterval(timer));
  return () => {
    peak = Math.max(peak, peakRss(child.pid));
    return peak;
  };
}

function makeFile(path: string): string {
  const fd = openSync(path, "w");
  const hash = createHash("sha256");
  for (let left = size; left > 0; left -= MiB) {
    const block = randomBytes(Math.min(MiB, left));
    hash.update(block);
    writeSync(fd, block);
  }
  closeSync(fd);
  return hash.digest("hex");
}

async function sha256File(path: string): Promise<string> {
  const hash = createHash("sha256");
  for await (const chunk of createReadStream(path, { highWaterMark: MiB }) as AsyncIterable<Buffer>) hash.update(chunk);
  return hash.digest("hex");
}

function run(argv: string[], stdoutPath: string, onStderr: (line: string) => void = () => undefined): { child: ChildProcess; done: Promise<number | null> } {
  const out = openSync(stdoutPath, "w");
  const child = spawn(argv[0]!, argv.slice(1), { cwd: root, stdio: ["ignore", out, "pipe"], env: { ...process.env, SLOTBROKER_LOG_LEVEL: "warn" } });
  closeSync(out);
  let rest = "";
  child.stderr!.setEncoding("utf8").on("data", (chunk: string) => {
    const lines = (rest + chunk).split("\n");
    rest = lines.pop() ?? "";
    lines.forEach(onStderr);
  });
  const done = new Promise<number | null>((resolve) => child.once("close", (code) => resolve(code)));
  return { child, done };
}

function startServer(args: string[], banner: RegExp, name: string): Promise<{ child: ChildProcess; match: RegExpExecArray }> {
  const child = spawn(process.execPath, [cli, ...args], { cwd: root, stdio: ["ignore", "pipe", "pipe"], env: { ...process.env, SLOTBROKER_LOG_LEVEL: "warn" } });
  let log = "";
  child.stderr.setEncoding("utf8").on("data", (s: string) => (log = (log + s).slice(-5000)));
  return waitForOutput(child, banner, { timeoutMs: 60_000, context: () => `${name}: ${log}` }).then((match) => ({ child, match }));
}

const dir = mkdtempSync(join(tmpdir(), "slotbroker-large-bench-"));
chmodSync(dir, 0o755);
let pg: LocalPostgres | undefined;
const children: ChildProcess[] = [];
try {
  note("building dist/ (npm run build)");
  const build = spawnSync("npm", ["run", "build"], { cwd: root, stdio: ["ignore", "ignore", "inherit"] });
  if (build.status !== 0) throw new Error("npm run build failed");
  note(`writing a ${Math.round(size / MiB)} MiB file`);
  const input = join(dir, "input.bin");
  const digest = makeFile(input);

  // --- cat FILE > OUT
  const catOut = join(dir, "cat.out");
  let t = performance.now();
  const cat = run(["cat", input], catOut);
  if ((await cat.done) !== 0) throw new Error("cat failed");
  const catSeconds = (performance.now() - t) / 1000;
  rmSync(catOut);

  // --- the pipe-throughput path, one round at the same size
  note("pipe-throughput path");
  let pipeMBps = 0;
  const pipeBench = spawn(process.execPath, [...nodeScript(join(root, "bench", "pipe-throughput.bench.ts"))], {
    cwd: root,
    stdio: ["ignore", "pipe", "inherit"],
    env: { ...process.env, PIPE_BENCH_SIZE: `${size}`, PIPE_BENCH_ROUNDS: "1" },
  });
  let pipeOut = "";
  pipeBench.stdout.setEncoding("utf8").on("data", (s: string) => (pipeOut += s));
  await new Promise((r) => pipeBench.once("close", r));
  for (const line of pipeOut.split("\n")) {
    try {
      const f = JSON.parse(line) as { metric: string; value: number };
      if (f.metric === "MB_per_s") pipeMBps = f.value;
    } catch {
      /* commentary */
    }
  }

  // --- the whole queue path
  const adminUrl = process.env.DATABASE_URL ?? (pg = await startEmbeddedPostgres({ dataDir: join(dir, "pg"), persistent: false })).url;
  const databaseUrl = (await createDatabase(adminUrl, "large_bench")).url;
  const execConfig = join(dir, "execserver.yaml");
  writeFileSync(
    execConfig,
    stringify({
      instanceId: "bench-exec",
      // Port 0: the execserver's banner names the ports it bound.
      listen: "127.0.0.1:0",
      adminListen: "127.0.0.1:0",
      waitgroups: { files: { processes: 2 } },
      services: { cat: { waitgroup: "files", command: ["cat"], timeout: "60m" } },
    }),
  );
  const exec = await startServer(["execserver", "--config", execConfig], /^execserver (\S+) listening grpc=(\S+) admin=(\S+)$/m, "execserver");
  children.push(exec.child);
  const fylrConfig = join(dir, "fylr.yaml");
  writeFileSync(
    fylrConfig,
    stringify({ name: "bench", listen: "127.0.0.1:0", databaseUrl, execserver: { addresses: [exec.match[2]] }, dispatcher: { pollInterval: "100ms" }, api: { watchPoll: "100ms" } }),
  );
  const fylr = await startServer(["fylr", "--config", fylrConfig], /^fylr (\S+) listening http=(\S+)$/m, "fylr");
  children.push(fylr.child);
  const api = `http://${fylr.match[2]}`;
  await new Promise((r) => setTimeout(r, 1500)); // broker connected
  const fylrPeak = trackPeak(fylr.child);
  const execPeak = trackPeak(exec.child);
  const queueOut = join(dir, "queue.out");
  note("queue path");
  const phases: Record<string, number> = {};
  t = performance.now();
  const submit = run([process.execPath, cli, "submit", "--api", api, "--service", "cat", "--stdin", input, "--wait"], queueOut, (line) => {
    const at = (performance.now() - t) / 1000;
    if (line.startsWith("item ") && phases.uploaded === undefined) phases.uploaded = at;
    if (line.startsWith("succeeded")) phases.ran = at;
  });
  const cliPeak = trackPeak(submit.child);
  const code = await submit.done;
  const queueSeconds = (performance.now() - t) / 1000;
  const cliRss = cliPeak();
  if (code !== 0) throw new Error(`submit exited with ${code}`);
  const ok = (await sha256File(queueOut)) === digest;
  if (!ok) throw new Error("the queue path's output differs from the input");
  const mbps = (seconds: number): number => size / 1e6 / seconds;
  const queueMBps = mbps(queueSeconds);
  emit({ bench: "large-item", metric: "queue_mb_s", value: queueMBps, baseline: "cat FILE > OUT", baseline_value: mbps(catSeconds), params: { ...params, seconds: queueSeconds, identical: ok } });
  if (pipeMBps > 0) {
    emit({ bench: "large-item", metric: "queue_mb_s", value: queueMBps, baseline: "pipe-throughput path (in-pipe → cat → out-pipe, no queue)", baseline_value: pipeMBps, params });
  }
  const upload = phases.uploaded ?? 0;
  const ranAt = phases.ran ?? upload;
  emit({ bench: "large-item", metric: "upload_mb_s", value: mbps(upload), baseline: "cat FILE > OUT", baseline_value: mbps(catSeconds), params: { ...params, seconds: upload } });
  emit({ bench: "large-item", metric: "run_mb_s", value: mbps(ranAt - upload), baseline: "cat FILE > OUT", baseline_value: mbps(catSeconds), params: { ...params, seconds: ranAt - upload, what: "store → in-pipe → cat → out-pipe → store" } });
  emit({ bench: "large-item", metric: "download_mb_s", value: mbps(queueSeconds - ranAt), baseline: "cat FILE > OUT", baseline_value: mbps(catSeconds), params: { ...params, seconds: queueSeconds - ranAt } });
  const goal = 200 * 1e6;
  for (const [name, rss] of [["fylr", fylrPeak()], ["execserver", execPeak()], ["submit CLI", cliRss]] as const) {
    emit({ bench: "large-item", metric: `peak_rss_mb ${name}`, value: rss / 1e6, baseline: "200 MB goal", baseline_value: goal / 1e6, params: { ...params, better: "lower" } });
  }
} finally {
  for (const child of children) child.kill("SIGTERM");
  await Promise.all(children.map((c) => new Promise((r) => (c.exitCode !== null || c.signalCode !== null ? r(undefined) : c.once("exit", r)))));
  await pg?.stop();
  rmSync(dir, { recursive: true, force: true });
}
