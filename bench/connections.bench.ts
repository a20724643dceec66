// connections: one execserver (the real CLI, its own process) with 10,000 broker
// connections from several client processes and 10⁶ parked wants, over real gRPC (HTTP/2)
// on loopback. Measures, in one run:
//   - grant latency (WANT → OFFER on an idle slot of another waitgroup, p50/p99) with 10
//     connections (the baseline), with 10,000, and with 10,000 plus 10⁶ parked wants;
//   - RSS of the execserver (VmRSS, not only the heap) per connection and per parked want,
//     plus the kernel's socket memory of the server's sockets (`ss -tm`);
//   - the HELLO frames 10,000 paced joins cause (coalesced broadcasts), and one broadcast's
//     cost when the client count changes by one: join → the last of 10,000 clients has the
//     new HELLO, and execserver CPU per change;
//   - the mass disconnect: every client process killed → the execserver shows no
//     connection and no parked want of theirs.
// The connections are paced (BATCH streams per client process, then a pause) and the
// execserver's fd limit is raised to the hard limit when it is lower than needed.
//   npm run bench -- connections                          full size: 10,000 and 10⁶ (6–10 min)
//   CONNECTIONS_SIZE=small npm run bench -- connections   2,000 and 2·10⁵ (about 1–2 min)
// CONNECTIONS_N, CONNECTIONS_WANTS, CONNECTIONS_CLIENTS, CONNECTIONS_SAMPLES override either
// size; BENCH_CHILD_NODE_ARGS (e.g. "--cpu-prof --cpu-prof-dir=/tmp/prof") go to the
// execserver, whose profile is written when it exits.
import { spawn, type ChildProcess } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createInterface } from "node:readline";
import { fileURLToPath } from "node:url";
import { encodeJob, encodeWant } from "../src/fylr/broker/frames.js";
import { create } from "@bufbuild/protobuf";
import { JobSpecSchema, type ConnectResponse } from "../gen/slotbroker/v1/broker_pb.js";
import { sleep } from "../src/shared/abort.js";
import { waitForOutput } from "../harness/child-output.js";
import { emit, nowUs, percentile } from "./lib/figure.js";
import { epochMs, H2BrokerStream } from "./lib/h2-broker-stream.js";
import { kernelSocketBytes, processCpuMs, processCpuSplitMs, rssBytes, slabBytes } from "./lib/proc-stats.js";
import { nodeScript } from "../harness/node-children.js";

const sizes = {
  full: { connections: 10_000, wants: 1_000_000, clients: 4, samples: 3000 },
  small: { connections: 2_000, wants: 200_000, clients: 2, samples: 1000 },
} as const;
const sizeName = (process.env.CONNECTIONS_SIZE ?? "full") as keyof typeof sizes;
const size = sizes[sizeName];
if (!size) throw new Error(`CONNECTIONS_SIZE: expected ${Object.keys(sizes).join(" or ")}, got ${sizeName}`);
const connections = Number(process.env.CONNECTIONS_N ?? size.connections);
const wants = Number(process.env.CONNECTIONS_WANTS ?? size.wants);
const clientProcesses = Number(process.env.CONNECTIONS_CLIENTS ?? size.clients);
const samples = Number(process.env.CONNECTIONS_SAMPLES ?? size.samples);
const baselineConnections = 10;
const batch = 100;
const pauseMs = 10;
const helloChanges = 4;
// e.g. "--cpu-prof --cpu-prof-dir=/tmp/prof" to profile the execserver (written on exit).
const execNodeArgs = (process.env.BENCH_CHILD_NODE_ARGS ?? process.env.CONNECTIONS_EXEC_NODE_ARGS ?? "").split(" ").filter(Boolean);
const here = fileURLToPath(new URL(".", import.meta.url));

/** One client process holding a share of the connections. */
class ClientProcess {
  private readonly waiters: ((message: Record<string, unknown>) => void)[] = [];

  constructor(readonly child: ChildProcess) {
    createInterface({ input: child.stdout! }).on("line", (line) => this.waiters.shift()?.(JSON.parse(line) as Record<string, unknown>));
  }

  static start(address: string, tag: string): ClientProcess {
    return new ClientProcess(spawn(process.execPath, [...nodeScript(join(here, "lib", "connections-client.ts")), address, tag], { stdio: ["pipe", "pipe", "inherit"] }));
  }

  ask(command: Record<string, unknown>): Promise<Record<string, unknown>> {
    return new Promise((resolve) => {
      this.waiters.push(resolve);
      this.child.stdin!.write(`${JSON.stringify(command)}\n`);
    });
  }
}

/** The probe: one stream that times WANT → OFFER on the idle `probe` slot, then JOB → DONE. */
class Probe {
  private waiting: ((frame: ConnectResponse) => void) | undefined;
  private readonly stream: H2BrokerStream;
  private readonly spec = create(JobSpecSchema, {});

  constructor(address: string) {
    this.stream = H2BrokerStream.open(address, (frame) => {
      if (frame.frame.case === "hello") return;
      const waiting = this.waiting;
      this.waiting = undefined;
      waiting?.(frame);
    });
  }

  async grants(count: number, tag: string): Promise<number[]> {
    const out: number[] = [];
    for (let i = 0; i < count; i++) {
      const jobId = `${tag}-${i}`;
      const start = nowUs();
      this.stream.write(encodeWant(jobId, "probe", 0));
      const offer = await this.next();
      out.push(nowUs() - start);
      if (offer.frame.case !== "offer") throw new Error(`probe: expected an offer, got ${offer.frame.case}`);
      this.stream.write(encodeJob(jobId, offer.frame.value.offerToken, this.spec));
      const done = await this.next();
      if (done.frame.case !== "done") throw new Error(`probe: expected done, got ${done.frame.case}`);
    }
    return out.sort((a, b) => a - b);
  }

  private next(): Promise<ConnectResponse> {
    return new Promise((resolve, reject) => {
      this.waiting = resolve;
      const check = setInterval(() => {
        if (!this.stream.closed) return;
        clearInterval(check);
        reject(new Error(`probe stream ended: ${this.stream.closeReason}`));
      }, 1000);
      const settle = this.waiting;
      this.waiting = (frame) => {
        clearInterval(check);
        settle(frame);
      };
    });
  }
}

function progress(line: string): void {
  process.stderr.write(`connections: ${line}\n`);
}

async function metric(admin: string, name: string): Promise<number> {
  let text = "";
  // A reused keep-alive connection may be reset under load; a fresh try is fine here.
  for (let attempt = 1; ; attempt++) {
    try {
      text = await (await fetch(`http://${admin}/metrics`)).text();
      break;
    } catch (err) {
      if (attempt >= 5) throw err;
      await sleep(100);
    }
  }
  let sum = 0;
  for (const line of text.split("\n")) if (line.startsWith(name) && !line.startsWith("#")) sum += Number(line.slice(line.lastIndexOf(" ") + 1));
  return sum;
}

async function clientStatus(clients: ClientProcess[]): Promise<Record<string, unknown>[]> {
  return Promise.all(clients.map((c) => c.ask({ cmd: "status" })));
}

/**
 * Waits until `expected` wants are in the `park` want-book. A want the execserver rejects
 * or a stream it closes would otherwise show only as a timeout, so both fail the wait at
 * once with what the clients saw; progress lines show the book against the WANT frames
 * the execserver has read so far.
 */
async function waitForParked(admin: string, clients: ClientProcess[], expected: number): Promise<void> {
  const start = Date.now();
  let lastNote = start;
  for (;;) {
    const depth = await metric(admin, 'slotbroker_book_depth{waitgroup="park"');
    if (depth >= expected) return;
    const status = await clientStatus(clients);
    const rejects = status.reduce((n, s) => n + Object.values(s.rejects as Record<string, number>).reduce((a, b) => a + b, 0), 0);
    const closed = status.reduce((n, s) => n + Number(s.closed), 0);
    if (rejects > 0 || closed > 0) throw new Error(`parking: ${depth} of ${expected} parked, ${rejects} wants rejected, ${closed} streams closed: ${JSON.stringify(status)}`);
    if (Date.now() - lastNote >= 10_000) {
      lastNote = Date.now();
      const read = await metric(admin, 'slotbroker_frames_received_total{kind="want"');
      progress(`parking: ${depth} of ${expected} in the book after ${Math.round((lastNote - start) / 1000)} s (${read} WANT frames read by the execserver)`);
    }
    if (Date.now() - start > 600_000) throw new Error(`timed out parking: ${depth} of ${expected} in the book`);
    await sleep(500);
  }
}

async function waitFor(what: string, check: () => Promise<boolean>, timeoutMs = 600_000, everyMs = 20): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!(await check())) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await sleep(everyMs);
  }
}

async function main(): Promise<void> {
  const dir = mkdtempSync(join(tmpdir(), "bench-connections-"));
  const config = join(dir, "exec.yaml");
  // `park` has one slot whose first OFFER is never answered, so every later want stays parked.
  writeFileSync(
    config,
    [
      "listen: 127.0.0.1:0",
      "adminListen: 127.0.0.1:0",
      "offerTimeout: 10m",
      // The server-wide cap (250,000 by default) would answer most of 10⁶ wants with BOOK_FULL.
      `maxWantsTotal: ${wants + 1000}`,
      "waitgroups: {probe: {processes: 1}, park: {processes: 1}}",
      "services: {probe: {waitgroup: probe, builtin: noop}, park: {waitgroup: park, builtin: noop}}",
      "",
    ].join("\n"),
  );
  const cli = join(here, "..", "src", "cli.ts");
  const fds = connections + 1000;
  // The fd limit is raised in the child's shell: node cannot raise its own.
  const exec = spawn("sh", ["-c", `[ "$(ulimit -n)" -ge ${fds} ] || ulimit -n ${fds} || ulimit -n "$(ulimit -Hn)"; exec "$@"`, "sh", process.execPath, ...execNodeArgs, ...nodeScript(cli), "execserver", "--config", config], {
    stdio: ["ignore", "pipe", "inherit"],
  });
  const clients: ClientProcess[] = [];
  try {
    const banner = await waitForOutput(exec, /grpc=(\S+) admin=(\S+)/, { timeoutMs: 60_000 });
    const [address, admin] = [banner[1]!, banner[2]!];
    const port = Number(address.split(":").pop());
    const pid = exec.pid!;
    const limit = /Max open files\s+(\d+)/.exec(readFileSync(`/proc/${pid}/limits`, "utf8"))?.[1];
    process.stderr.write(`connections: execserver pid ${pid}, fd limit ${limit}\n`);
    if (Number(limit) < fds) throw new Error(`execserver fd limit ${limit} < ${fds}; raise the hard limit (ulimit -Hn)`);

    // Baseline: the probe plus 9 idle streams.
    const probe = new Probe(address);
    const idle = Array.from({ length: baselineConnections - 1 }, () => H2BrokerStream.open(address, () => undefined));
    await waitFor("10 connections", async () => (await metric(admin, "slotbroker_connections")) === baselineConnections);
    await probe.grants(1000, "warm");
    const base = await probe.grants(samples, "base");
    await sleep(500);
    const rss0 = rssBytes(pid);
    const kernel0 = kernelSocketBytes(port);

    // 10,000 paced joins from several processes.
    for (let c = 0; c < clientProcesses; c++) clients.push(ClientProcess.start(address, `c${c}`));
    await Promise.all(clients.map((c) => c.ask({ cmd: "hellos" }))); // started and listening
    const slab0 = slabBytes();
    const cpuJoin0 = processCpuMs(pid);
    const joinStart = Date.now();
    const per = Math.ceil(connections / clientProcesses);
    const opened = await Promise.all(clients.map((c, i) => c.ask({ cmd: "open", count: Math.min(per, connections - i * per), batch, pauseMs })));
    const total = baselineConnections + opened.reduce((n, o) => n + Number(o.count), 0);
    await Promise.all(clients.map((c) => c.ask({ cmd: "expect", clients: total })));
    const joinMs = Date.now() - joinStart;
    const cpuJoin = processCpuMs(pid) - cpuJoin0;
    const hellos = (await Promise.all(clients.map((c) => c.ask({ cmd: "hellos" })))).reduce((n, r) => n + Number(r.count), 0);
    const closedEarly = opened.reduce((n, o) => n + Number(o.closed), 0);
    process.stderr.write(`connections: ${total} open after ${joinMs} ms (${closedEarly} closed), ${hellos} HELLO frames\n`);
    await sleep(2000);
    const rss1 = rssBytes(pid);
    const kernel1 = kernelSocketBytes(port);
    const slab1 = slabBytes();
    const atScale = await probe.grants(samples, "scale");
    const us = (xs: number[]): string => `p50 ${percentile(xs, 50).toFixed(0)} µs, p99 ${percentile(xs, 99).toFixed(0)} µs`;
    progress(`grant with ${baselineConnections}: ${us(base)}; with ${total}: ${us(atScale)}; RSS ${rss0} → ${rss1} B, kernel socket bytes ${kernel0} → ${kernel1}`);

    // What the execserver spends with nothing changing (keepalive pings, timers), to take
    // out of the per-change figure below.
    const idle0 = { at: Date.now(), cpu: processCpuSplitMs(pid) };
    await sleep(3000);
    const idle1 = { at: Date.now(), cpu: processCpuSplitMs(pid) };
    const idleCpuPerMs = (idle1.cpu.user + idle1.cpu.system - idle0.cpu.user - idle0.cpu.system) / (idle1.at - idle0.at);

    // HELLO broadcast when the count changes by one: a join, then the same stream leaving.
    const cpuHello0 = processCpuSplitMs(pid);
    const helloStart = Date.now();
    const broadcastMs: number[] = [];
    for (let i = 0; i < helloChanges / 2; i++) {
      for (const change of ["join", "leave"] as const) {
        const t0 = epochMs();
        if (change === "join") idle.push(H2BrokerStream.open(address, () => undefined));
        else idle.pop()!.destroy();
        const expected = change === "join" ? total + 1 : total;
        const seen = await Promise.all(clients.map((c) => c.ask({ cmd: "expect", clients: expected })));
        broadcastMs.push(Math.max(...seen.map((s) => Number(s.last))) - t0);
        await sleep(300);
      }
    }
    const cpuHello1 = processCpuSplitMs(pid);
    const userPerChange = (cpuHello1.user - cpuHello0.user) / helloChanges;
    const systemPerChange = (cpuHello1.system - cpuHello0.system) / helloChanges;
    const cpuPerChange = userPerChange + systemPerChange;
    const idlePerChange = (idleCpuPerMs * (Date.now() - helloStart)) / helloChanges;
    broadcastMs.sort((a, b) => a - b);
    progress(
      `HELLO broadcast after one change: ${broadcastMs.map((m) => m.toFixed(0)).join(", ")} ms; execserver CPU per change ${cpuPerChange} ms ` +
        `(user ${userPerChange}, system ${systemPerChange}; ${idlePerChange.toFixed(0)} of it what an unchanging period of that length costs)`,
    );

    // 10⁶ parked wants spread over the client connections.
    const perStream = Math.ceil(wants / (total - baselineConnections));
    const parkStart = Date.now();
    const written = await Promise.all(clients.map((c) => c.ask({ cmd: "park", perStream, service: "park" })));
    const parked = perStream * (total - baselineConnections);
    const onOpenStreams = written.reduce((n, w) => n + Number(w.wants), 0);
    if (onOpenStreams < parked) throw new Error(`${parked - onOpenStreams} wants went to streams already closed: ${JSON.stringify(await clientStatus(clients))}`);
    await waitForParked(admin, clients, parked - 1); // the first want holds the slot's OFFER
    const parkMs = Date.now() - parkStart;
    await sleep(2000);
    const rss2 = rssBytes(pid);
    progress(`${parked} wants parked in ${parkMs} ms; RSS ${rss2} B`);
    const withWants = await probe.grants(samples, "parked");
    progress(`grant with ${parked} parked: ${us(withWants)}`);

    // Mass disconnect: every client process killed at once.
    const cpuDrop0 = processCpuMs(pid);
    const dropStart = Date.now();
    for (const c of clients) c.child.kill("SIGKILL");
    let left = { connections: -1, wants: -1 };
    await waitFor(
      "the mass disconnect",
      async () => {
        left = { connections: await metric(admin, "slotbroker_connections"), wants: await metric(admin, 'slotbroker_book_depth{waitgroup="park"') };
        return left.connections === baselineConnections && left.wants === 0;
      },
      120_000,
    ).catch((err: unknown) => {
      throw new Error(`${(err as Error).message}: ${left.connections} connections and ${left.wants} parked wants left`);
    });
    const dropMs = Date.now() - dropStart;
    const dropCpuMs = processCpuMs(pid) - cpuDrop0;
    progress(`mass disconnect: ${dropMs} ms (execserver CPU ${dropCpuMs} ms)`);
    const after = await probe.grants(samples, "after");

    const params = { connections: total, parked, client_processes: clientProcesses, samples, batch, pauseMs, join_ms: joinMs, park_ms: parkMs, better: "lower" };
    const p = (xs: number[], q: number): number => percentile(xs, q);
    for (const q of [50, 99]) {
      emit({ bench: "connections", metric: `grant_p${q}_us`, value: p(atScale, q), baseline: `grant with ${baselineConnections} connections`, baseline_value: p(base, q), params: { ...params, goal: q === 99 ? "≤ 2" : undefined } });
      emit({
        bench: "connections",
        metric: `grant_parked_p${q}_us`,
        value: p(withWants, q),
        baseline: `grant with ${baselineConnections} connections`,
        baseline_value: p(base, q),
        params: { ...params, goal: q === 99 ? "≤ 2" : undefined, after_disconnect_us: p(after, q) },
      });
    }
    const perConnection = (rss1 - rss0) / (total - baselineConnections);
    const kernelPerConnection = (kernel1 - kernel0) / (total - baselineConnections);
    emit({
      bench: "connections",
      metric: "bytes_per_connection",
      value: perConnection + kernelPerConnection,
      baseline: "64 KiB budget per connection",
      baseline_value: 64 * 1024,
      params: { ...params, rss_bytes: Math.round(perConnection), kernel_socket_bytes: Math.round(kernelPerConnection),
        // Both ends of every loopback connection are on this machine, hence ÷ 2; machine-wide, so noisy.
        kernel_slab_bytes_per_socket: Math.round((slab1 - slab0) / (2 * (total - baselineConnections))), rss_before: rss0, rss_after: rss1, measure: "execserver VmRSS + ss -tm skmem of its sockets" },
    });
    emit({ bench: "connections", metric: "bytes_per_parked_want", value: (rss2 - rss1) / parked, baseline: "1 KiB budget per want", baseline_value: 1024, params: { ...params, rss_after: rss2, measure: "execserver VmRSS" } });
    const n = total - baselineConnections;
    emit({
      bench: "connections",
      metric: "hello_frames_per_join",
      value: hellos / n,
      baseline: "uncoalesced (every join → HELLO to everyone)",
      baseline_value: (n + 1) / 2 + baselineConnections,
      params: { ...params, hello_frames: hellos, joins: n, join_cpu_ms: cpuJoin },
    });
    emit({
      bench: "connections",
      metric: "hello_broadcast_ms",
      value: percentile(broadcastMs, 50),
      // The execserver's own window at this many streams (src/execserver/hello-broadcast.ts, defaults).
      baseline: "the HELLO window at this many streams",
      baseline_value: Math.max(100, Math.ceil((total / 2000) * 1000)),
      params: {
        ...params,
        changes: helloChanges,
        max_ms: broadcastMs.at(-1),
        cpu_ms_per_change: cpuPerChange,
        user_ms_per_change: userPerChange,
        system_ms_per_change: systemPerChange,
        idle_cpu_ms_per_change: Math.round(idlePerChange),
        what: "one join or leave → the last of every client's HELLO with the new count",
      },
    });
    emit({
      bench: "connections",
      metric: "mass_disconnect_ms",
      value: dropMs,
      baseline: "budget 1 s per 10,000 connections",
      baseline_value: 1000 * (n / 10_000),
      params: { ...params, wants_dropped: parked - 1, cpu_ms: dropCpuMs },
    });
    for (const s of idle) s.destroy();
  } finally {
    for (const c of clients) c.child.kill("SIGKILL");
    // SIGTERM first: a CPU profile is written on a clean exit.
    const exited = new Promise((resolve) => exec.once("exit", resolve));
    exec.kill("SIGTERM");
    await Promise.race([exited, sleep(15_000)]);
    exec.kill("SIGKILL");
    rmSync(dir, { recursive: true, force: true });
  }
}

await main();
process.exit(0);
