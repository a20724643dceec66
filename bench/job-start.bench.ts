// job-start: what starting a job's process costs the execserver. Two execservers (the real
// CLI, each its own process, 2 slots of the command service `true`): one starts jobs through
// the job launcher (`jobLauncher: true`: the native launcher when it is built, else the Node
// script; the figures' `launcher` parameter says which ran), the baseline forks them itself
// (`jobLauncher: false`). One broker client per execserver runs jobs one at a time
// (acquire → JOB → DONE), alternating blocks between the two. Figures:
//   job_done_p50_us / job_done_p90_us   JOB sent → DONE received, as the fylr sees it
//   exec_cpu_ms_per_job                 user+system CPU per job of the execserver plus its
//                                       live helpers (launcher, reaper) and the jobs they
//                                       waited for (/proc stat), i.e. the whole cost
//   exec_own_cpu_ms_per_job             the execserver process alone (its event loop)
// A note on stderr gives the execserver's own CPU per job of the builtin `noop` (no
// process at all: the WANT/OFFER/JOB/DONE cycle and its bookkeeping), so what starting a
// process adds can be read off against it.
// Both execservers idle their builtin noop first, so their heaps are alike.
//   npm run bench -- job-start        JOB_START_BLOCKS=6 JOB_START_PER_BLOCK=100
//   JOB_START_OUTPUT=short            the job prints one short line (`echo`) and carries a
//                                     stdout URL, as every job of a fylr does (never opened:
//                                     the line goes back in the receipt)
//   JOB_START_STDIN=N                 with JOB_START_OUTPUT=short: the job is `sha256sum` of
//                                     N random bytes of inline stdin (end-to-end's sha256 shape)
//   JOB_START_BASELINE_TREE=DIR       the baseline is that checkout's execserver (its src/
//                                     and dist/native/) with the job launcher, not forking
import { randomBytes } from "node:crypto";
import { mkdtempSync, readFileSync, readlinkSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { create } from "@bufbuild/protobuf";
import { JobSpecSchema } from "../gen/slotbroker/v1/broker_pb.js";
import { BrokerClient, brokerSlot, compileBrokerConfig } from "../src/fylr/broker/index.js";
import { emit, nowUs, percentile } from "./lib/figure.js";
import { cpuParts, withLiveChildren } from "./lib/proc-cpu.js";
import { startChild } from "./lib/raw-grpc.js";

const blocks = Number(process.env.JOB_START_BLOCKS ?? 6);
const perBlock = Number(process.env.JOB_START_PER_BLOCK ?? 100);
const warmup = 50;
const shortOutput = process.env.JOB_START_OUTPUT === "short";
const baselineTree = process.env.JOB_START_BASELINE_TREE;
const stdinBytes = shortOutput ? Number(process.env.JOB_START_STDIN ?? 0) : 0;

interface Side {
  readonly name: string;
  readonly pid: number;
  readonly broker: BrokerClient;
  readonly jobDone: number[];
  cpuMs: number;
  ownCpuMs: number;
}

/** CPU ms of the execserver and its live helpers (with the jobs they waited for). */
function cpuOf(pid: number): { all: number; own: number } {
  let all = 0;
  for (const p of withLiveChildren([pid])) {
    const { own, children } = cpuParts(p);
    all += own + children;
  }
  const self = cpuParts(pid);
  return { all, own: self.own };
}

/** Which job launcher the execserver `pid` runs: "native", "node", or "none". */
function launcherKind(pid: number): string {
  for (const child of withLiveChildren([pid]).slice(1)) {
    try {
      // Both launchers are titled slotbroker-job-launcher; the native one is also that file.
      if (!readFileSync(`/proc/${child}/cmdline`, "utf8").startsWith("slotbroker-job-launcher")) continue;
      return readlinkSync(`/proc/${child}/exe`).endsWith("/slotbroker-job-launcher") ? "native" : "node";
    } catch {
      // gone meanwhile
    }
  }
  return "none";
}

async function runJobs(side: Side, service: string, n: number, record: boolean): Promise<void> {
  const spec = create(
    JobSpecSchema,
    shortOutput && service === "t" ? { stdoutUrl: "http://127.0.0.1:9/never-opened", ...(stdinBytes > 0 ? { stdinInline: randomBytes(stdinBytes) } : {}) } : {},
  );
  const before = cpuOf(side.pid);
  for (let i = 0; i < n; i++) {
    const slot = brokerSlot(await side.broker.acquire({ service }));
    const start = nowUs();
    await slot.start(spec);
    if (record) side.jobDone.push(nowUs() - start);
  }
  const after = cpuOf(side.pid);
  if (!record) return;
  side.cpuMs += after.all - before.all;
  side.ownCpuMs += after.own - before.own;
}

async function main(): Promise<void> {
  const dir = mkdtempSync(join(tmpdir(), "bench-job-start-"));
  const cli = join(fileURLToPath(import.meta.url), "..", "..", "src", "cli.ts");
  const command = stdinBytes > 0 ? '["sha256sum"]' : shortOutput ? '["echo", "job-start: one short line of output"]' : '["true"]';
  const services = `waitgroups: {w: {processes: 2}}\nservices: {noop: {waitgroup: w, builtin: noop}, t: {waitgroup: w, command: ${command}}}\n`;
  const sides: Side[] = [];
  const children: { kill: () => void }[] = [];
  try {
    for (const [name, launcher, tree] of [
      ["launcher", true, undefined],
      ["direct", baselineTree !== undefined, baselineTree],
    ] as const) {
      const config = join(dir, `${name}.yaml`);
      writeFileSync(config, `jobLauncher: ${launcher}\nlisten: 127.0.0.1:0\nadminListen: 127.0.0.1:0\n${services}`);
      const exec = await startChild([tree ? join(tree, "src", "cli.ts") : cli, "execserver", "--config", config]);
      children.push({ kill: () => exec.child.kill("SIGTERM") });
      const broker = new BrokerClient(compileBrokerConfig({ addresses: [exec.address], clientName: `bench-${name}`, maxConnectionsPerAddress: 1 }));
      broker.start();
      children.push({ kill: () => void broker.close() });
      sides.push({ name, pid: exec.child.pid!, broker, jobDone: [], cpuMs: 0, ownCpuMs: 0 });
    }
    while (sides.some((s) => s.broker.instances().length === 0)) await new Promise((r) => setTimeout(r, 10));
    for (const side of sides) {
      await runJobs(side, "noop", warmup * 4, false);
      await runJobs(side, "t", warmup, false);
    }
    for (let b = 0; b < blocks; b++) for (const side of b % 2 ? [...sides].reverse() : sides) await runJobs(side, "t", perBlock, true);
    const direct0 = sides[1]!;
    const noopBefore = cpuOf(direct0.pid).own;
    await runJobs(direct0, "noop", perBlock * 4, false);
    const noopMs = (cpuOf(direct0.pid).own - noopBefore) / (perBlock * 4);
    process.stderr.write(`job-start: the direct execserver's own CPU per builtin noop job (no process): ${noopMs.toFixed(3)} ms\n`);
    for (const side of sides) side.jobDone.sort((x, y) => x - y);
    const n = blocks * perBlock;
    const [launcher, direct] = sides as [Side, Side];
    const params = {
      service: stdinBytes > 0 ? `\`sha256sum\` of ${stdinBytes} B inline stdin with a stdout URL, one job at a time` : shortOutput ? "`echo` (one short line) with a stdout URL, one job at a time" : "`true`, one job at a time",
      jobs: n,
      blocks,
      launcher: launcherKind(launcher.pid),
      baseline_config: baselineTree ? `${baselineTree}, jobLauncher: true (${launcherKind(direct.pid)})` : "jobLauncher: false",
      better: "lower",
    };
    const baselineName = baselineTree ? "the other tree's execserver with its job launcher" : "the execserver forks the job itself";
    const figure = (metric: string, value: number, baseline: number, extra: Record<string, unknown> = {}): void => {
      emit({ bench: "job-start", metric, value, baseline: baselineName, baseline_value: baseline, params: { ...params, ...extra } });
    };
    figure("job_done_p50_us", percentile(launcher.jobDone, 50), percentile(direct.jobDone, 50));
    figure("job_done_p90_us", percentile(launcher.jobDone, 90), percentile(direct.jobDone, 90));
    figure("exec_cpu_ms_per_job", launcher.cpuMs / n, direct.cpuMs / n, { what: "execserver + launcher/reaper + the jobs, per job" });
    figure("exec_own_cpu_ms_per_job", launcher.ownCpuMs / n, direct.ownCpuMs / n, { what: "the execserver process alone, per job" });
  } finally {
    for (const child of children.reverse()) child.kill();
    rmSync(dir, { recursive: true, force: true });
  }
}

await main();
