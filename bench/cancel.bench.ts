// cancel: how fast a cancelled running job is really gone. One execserver (the real CLI, its
// own process) runs a job that is a process group (a shell and its `sleep` child); a fylr
// broker client (src/fylr/broker) sends JOB, waits until the job has started, then cancels
// it (abort with a cancel request: the client sends CANCEL). Timed from the cancel:
//   gone_p50_ms / gone_p99_ms   until every process of the job's group has exited
//   done_p50_ms / done_p99_ms   until the DONE with the CANCEL_REQUESTED receipt arrived
// Baseline, in the same run in alternating blocks: the same shell-and-sleep group spawned
// by this process and sent SIGTERM directly (the floor: signal delivery and exit), timed
// with the same /proc poller. 100 cancels.
//   npm run bench -- cancel
import { spawn } from "node:child_process";
import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { readFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { create } from "@bufbuild/protobuf";
import { ErrorKind, JobSpecSchema } from "../gen/slotbroker/v1/broker_pb.js";
import { BrokerClient, brokerSlot, compileBrokerConfig } from "../src/fylr/broker/index.js";
import { AbortReason } from "../src/shared/abort.js";
import { emit, percentile } from "./lib/figure.js";
import { startChild } from "./lib/raw-grpc.js";

const total = 100;
const block = 10;
const warmup = 5;
// The child is forked before the pid file is written, so the group is complete once it exists.
const script = 'sleep 60 & echo $$ > "$1"; wait';

const ms = (): number => performance.now();
const tick = (): Promise<void> => new Promise((resolve) => setTimeout(resolve, 1));

async function pidFrom(file: string): Promise<number> {
  for (;;) {
    if (existsSync(file)) {
      const pid = Number(readFileSync(file, "utf8").trim());
      if (pid > 0) return pid;
    }
    await tick();
  }
}

/** The group's members now (one /proc scan; done before the clock starts). */
async function members(pgid: number): Promise<number[]> {
  const { readdir } = await import("node:fs/promises");
  const out: number[] = [];
  for (const entry of await readdir("/proc")) {
    if (!/^\d+$/.test(entry)) continue;
    const stat = await readFile(`/proc/${entry}/stat`, "utf8").catch(() => "");
    const fields = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
    if (Number(fields[2]) === pgid) out.push(Number(entry));
  }
  return out;
}

/** Resolves when every pid has exited (gone, or a zombie: it runs nothing any more). */
async function allGone(pids: readonly number[]): Promise<void> {
  for (const pid of pids) {
    for (;;) {
      const stat = await readFile(`/proc/${pid}/stat`, "utf8").catch(() => "");
      if (!stat || stat.slice(stat.lastIndexOf(")") + 2)[0] === "Z") break;
      await tick();
    }
  }
}

async function cancelOnce(broker: BrokerClient, dir: string, i: number): Promise<{ gone: number; done: number }> {
  const file = join(dir, `job-${i}`);
  const slot = brokerSlot(await broker.acquire({ service: "group" }));
  const controller = new AbortController();
  const receipt = slot.start(create(JobSpecSchema, { args: [file] }), controller.signal);
  const pgid = await pidFrom(file);
  const pids = await members(pgid);
  if (pids.length < 2) throw new Error(`job ${i}: expected a shell and its child in group ${pgid}, found ${pids.length}`);
  const start = ms();
  controller.abort(new AbortReason("cancel-requested", "bench"));
  let done = 0;
  const doneAt = receipt.then((r) => {
    if (r.error !== ErrorKind.CANCEL_REQUESTED) throw new Error(`job ${i}: receipt error ${ErrorKind[r.error]}, not CANCEL_REQUESTED`);
    done = ms() - start;
  });
  await allGone(pids);
  const gone = ms() - start;
  await doneAt;
  return { gone, done };
}

async function killOnce(dir: string, i: number): Promise<number> {
  const file = join(dir, `local-${i}`);
  const child = spawn("sh", ["-c", script, "local", file], { detached: true, stdio: "ignore" });
  const exited = new Promise((resolve) => child.once("exit", resolve));
  const pgid = await pidFrom(file);
  const pids = await members(pgid);
  const start = ms();
  process.kill(-pgid, "SIGTERM");
  await allGone(pids);
  const gone = ms() - start;
  await exited;
  return gone;
}

async function main(): Promise<void> {
  const dir = mkdtempSync(join(tmpdir(), "bench-cancel-"));
  const config = join(dir, "exec.yaml");
  writeFileSync(
    config,
    `listen: 127.0.0.1:0\nadminListen: 127.0.0.1:0\nwaitgroups: {bench: {processes: 1}}\nservices: {group: {waitgroup: bench, command: ["sh", "-c", ${JSON.stringify(script)}, "group"]}}\n`,
  );
  const here = fileURLToPath(import.meta.url);
  const exec = await startChild([join(here, "..", "..", "src", "cli.ts"), "execserver", "--config", config]);
  const broker = new BrokerClient(compileBrokerConfig({ addresses: [exec.address], clientName: "bench-cancel", maxConnectionsPerAddress: 1 }));
  broker.start();
  try {
    while (broker.instances().length === 0) await new Promise((r) => setTimeout(r, 10));
    for (let i = 0; i < warmup; i++) {
      await cancelOnce(broker, dir, -1 - i);
      await killOnce(dir, -1 - i);
    }
    const gone: number[] = [];
    const done: number[] = [];
    const local: number[] = [];
    for (let i = 0; i < total; i += block) {
      for (let j = i; j < i + block; j++) local.push(await killOnce(dir, j));
      for (let j = i; j < i + block; j++) {
        const r = await cancelOnce(broker, dir, j);
        gone.push(r.gone);
        done.push(r.done);
      }
    }
    for (const list of [gone, done, local]) list.sort((a, b) => a - b);
    const params = { cancels: gone.length, job: "sh + sleep child (one process group)", server: "separate process", better: "lower" };
    const figure = (metric: string, values: number[], p: number, what: string): void => {
      emit({ bench: "cancel", metric, value: percentile(values, p), baseline: "SIGTERM to a local process group", baseline_value: percentile(local, p), params: { ...params, what } });
    };
    figure("gone_p50_ms", gone, 50, "cancel → every process of the job's group exited");
    figure("gone_p99_ms", gone, 99, "cancel → every process of the job's group exited");
    figure("done_p50_ms", done, 50, "cancel → DONE with the CANCEL_REQUESTED receipt");
    figure("done_p99_ms", done, 99, "cancel → DONE with the CANCEL_REQUESTED receipt");
  } finally {
    await broker.close();
    exec.child.kill("SIGTERM");
    rmSync(dir, { recursive: true, force: true });
  }
}

await main();
