// pipe-throughput: bytes per second of a job's stdin and stdout through one-time pipes.
// The fylr side (this process) serves an in-pipe and an out-pipe on its HTTP server; the
// execserver side (a child process, as in production) runs the job `cat` with the real
// runner (src/execserver/runner `runJob`): GET the in-pipe → cat's stdin, cat's stdout →
// chunked PUT to the out-pipe. The clock runs from "go" until the out-pipe's `done`.
// Baselines, measured in the same run in alternating rounds:
//   raw          two plain node:http servers here (GET source, PUT sink); the child relays
//                GET → PUT with node:http, no cat — the main baseline (goal ≥ 0.6, bench/README.md)
//   raw-cat      the same servers, the child relays GET → cat → PUT with node:http and
//                child_process: isolates the pipe server + runner from the cost of cat
// A third figure runs the raw relay (no cat, no runner) against the fylr's pipes: the
// pipe server's own cost against plain node:http servers.
// Size: default 1 GiB; PIPE_BENCH_SIZE=256MiB or a first argument shrinks it. Rounds:
// PIPE_BENCH_ROUNDS (default 5); each figure is the median of its rounds.
//   npm run bench -- pipe-throughput
//   PIPE_BENCH_SIZE=128MiB npx tsx bench/pipe-throughput.bench.ts
import { spawn, type ChildProcess } from "node:child_process";
import { randomBytes } from "node:crypto";
import * as http from "node:http";
import type { AddressInfo } from "node:net";
import { createInterface } from "node:readline";
import { Readable, Writable } from "node:stream";
import { pipeline } from "node:stream/promises";
import { fileURLToPath } from "node:url";
import { ErrorKind } from "../gen/slotbroker/v1/broker_pb.js";
import { PipeRegistry, pipeUrls, startFylrHttpServer } from "../src/fylr/index.js";
import { emit } from "./lib/figure.js";
import { nodeScript } from "../harness/node-children.js";

type Mode = "runjob" | "raw" | "raw-cat" | "pipes-relay";
interface RelayResult {
  ok: boolean;
  detail: string;
}

const BLOCK = 1024 * 1024;

// ---- child: the execserver side -------------------------------------------------------

async function relayMain(mode: Mode, inUrl: string, outUrl: string): Promise<void> {
  // Imported before "ready" so module loading stays outside the clock.
  const runner = mode === "runjob" ? await import("../src/execserver/runner/index.js") : undefined;
  process.stdout.write("ready\n");
  await new Promise<void>((resolve) => process.stdin.once("data", () => resolve()));
  let result: RelayResult;
  if (runner) {
    const receipt = await runner.runJob({
      command: ["cat"],
      args: [],
      env: {},
      timeoutMs: 30 * 60_000,
      stdinUrl: inUrl,
      stdoutUrl: outUrl,
      signal: new AbortController().signal,
    });
    const ok = receipt.exitCode === 0 && receipt.error === ErrorKind.UNSPECIFIED && receipt.stdoutStreamed;
    result = { ok, detail: `exit=${receipt.exitCode} error=${receipt.error} ${receipt.errorMessage} stdout_bytes=${receipt.stdoutBytes}` };
  } else {
    result = await rawRelay(inUrl, outUrl, mode === "raw-cat");
  }
  process.stdout.write(`${JSON.stringify(result)}\n`);
}

function rawRelay(inUrl: string, outUrl: string, throughCat: boolean): Promise<RelayResult> {
  return new Promise((resolve) => {
    const fail = (err: unknown): void => resolve({ ok: false, detail: String(err) });
    http
      .get(inUrl, { agent: false }, (source) => {
        const put = http.request(outUrl, { method: "PUT", agent: false }, (res) => {
          res.resume();
          res.on("end", () => resolve({ ok: res.statusCode !== undefined && res.statusCode < 300, detail: `status ${res.statusCode}` }));
        });
        put.on("error", fail);
        if (!throughCat) {
          pipeline(source, put).catch(fail);
          return;
        }
        const cat = spawn("cat", [], { stdio: ["pipe", "pipe", "inherit"] });
        pipeline(source, cat.stdin).catch(fail);
        pipeline(cat.stdout, put).catch(fail);
      })
      .on("error", fail);
  });
}

// ---- parent: the fylr side and the raw servers ----------------------------------------

/** `total` bytes of a repeated random block, produced on demand (never all in memory). */
function byteSource(total: number, block: Buffer): Readable {
  let left = total;
  return new Readable({
    highWaterMark: BLOCK,
    read() {
      if (left <= 0) return void this.push(null);
      const chunk = left >= block.length ? block : block.subarray(0, left);
      left -= chunk.length;
      this.push(chunk);
    },
  });
}

/** A sink that counts and drops. */
function countingSink(): Writable & { bytes: number } {
  const sink = new Writable({
    highWaterMark: BLOCK,
    write(chunk: Buffer, _enc, callback) {
      sink.bytes += chunk.length;
      callback();
    },
  }) as Writable & { bytes: number };
  sink.bytes = 0;
  return sink;
}

function listen(server: http.Server): Promise<string> {
  return new Promise((resolve) => {
    server.listen(0, "127.0.0.1", () => resolve(`http://127.0.0.1:${(server.address() as AddressInfo).port}`));
  });
}

interface RawServers {
  base: string;
  /** Arms the servers for one round; resolves with the bytes the sink received. */
  arm(total: number): Promise<number>;
  close(): void;
}

async function rawServers(block: Buffer): Promise<RawServers> {
  let total = 0;
  let received: ((bytes: number) => void) | undefined;
  let failed: ((err: Error) => void) | undefined;
  const server = http.createServer({ requestTimeout: 0 }, (req, res) => {
    if (req.method === "GET") {
      res.writeHead(200, { "content-type": "application/octet-stream" });
      pipeline(byteSource(total, block), res).catch(() => undefined);
      return;
    }
    const sink = countingSink();
    pipeline(req, sink).then(
      () => {
        res.writeHead(204).end();
        received?.(sink.bytes);
      },
      (err: Error) => {
        res.destroy();
        failed?.(err);
      },
    );
  });
  const base = await listen(server);
  return {
    base,
    arm: (bytes) => {
      total = bytes;
      return new Promise((resolve, reject) => {
        received = resolve;
        failed = reject;
      });
    },
    close: () => server.close(),
  };
}

function startRelay(mode: Mode, inUrl: string, outUrl: string): Promise<{ child: ChildProcess; go(): Promise<RelayResult> }> {
  const self = fileURLToPath(import.meta.url);
  const child = spawn(process.execPath, [...nodeScript(self), "--relay", mode, inUrl, outUrl], {
    stdio: ["pipe", "pipe", "inherit"],
  });
  const lines = createInterface({ input: child.stdout });
  const next = (): Promise<string> =>
    new Promise((resolve, reject) => {
      lines.once("line", resolve);
      child.once("exit", (code) => reject(new Error(`relay (${mode}) exited with ${code}`)));
    });
  return next().then(() => ({
    child,
    go: () => {
      const result = next().then((line) => JSON.parse(line) as RelayResult);
      child.stdin.write("go\n");
      return result;
    },
  }));
}

async function timedRound(mode: Mode, total: number, ctx: { registry: PipeRegistry; fylrPort: number; raw: RawServers; block: Buffer }): Promise<number> {
  let inUrl: string;
  let outUrl: string;
  let landed: Promise<number>;
  if (mode === "runjob" || mode === "pipes-relay") {
    const pipeIn = ctx.registry.createInPipe(byteSource(total, ctx.block), { ttlMs: 60_000 });
    const pipeOut = ctx.registry.createOutPipe(countingSink(), { ttlMs: 60_000 });
    const urls = pipeUrls("127.0.0.1", ctx.fylrPort, { in: pipeIn.id, out: pipeOut.id });
    inUrl = urls.in!;
    outUrl = urls.out!;
    landed = pipeOut.done;
  } else {
    inUrl = `${ctx.raw.base}/source`;
    outUrl = `${ctx.raw.base}/sink`;
    landed = ctx.raw.arm(total);
  }
  const relay = await startRelay(mode, inUrl, outUrl);
  try {
    const t0 = process.hrtime.bigint();
    const [bytes, result] = await Promise.all([landed, relay.go()]);
    const seconds = Number(process.hrtime.bigint() - t0) / 1e9;
    if (!result.ok) throw new Error(`relay (${mode}) failed: ${result.detail}`);
    if (bytes !== total) throw new Error(`relay (${mode}) moved ${bytes} bytes, expected ${total}`);
    return total / 1e6 / seconds;
  } finally {
    relay.child.kill();
  }
}

function parseSize(text: string | undefined): number {
  if (!text) return 1024 ** 3;
  const m = /^(\d+(?:\.\d+)?)\s*(B|KiB|MiB|GiB)?$/i.exec(text.trim());
  if (!m) throw new Error(`size "${text}": expected e.g. 1GiB, 256MiB, 1048576`);
  const unit = { b: 1, kib: 1024, mib: 1024 ** 2, gib: 1024 ** 3 }[(m[2] ?? "b").toLowerCase() as "b"];
  return Math.round(Number(m[1]) * unit);
}

function median(values: number[]): number {
  const sorted = [...values].sort((a, b) => a - b);
  return sorted[Math.floor(sorted.length / 2)]!;
}

async function main(): Promise<void> {
  const total = parseSize(process.argv[2] ?? process.env.PIPE_BENCH_SIZE);
  const rounds = Number(process.env.PIPE_BENCH_ROUNDS ?? 5);
  const block = randomBytes(BLOCK);
  const registry = new PipeRegistry();
  const fylr = await startFylrHttpServer({ listen: "127.0.0.1:0", registry });
  const raw = await rawServers(block);
  const ctx = { registry, fylrPort: fylr.port, raw, block };
  const samples: Record<Mode, number[]> = { runjob: [], raw: [], "raw-cat": [], "pipes-relay": [] };
  try {
    for (let round = 0; round < rounds; round++) {
      for (const mode of ["raw", "runjob", "raw-cat", "pipes-relay"] as const) {
        const mbps = await timedRound(mode, total, ctx);
        samples[mode].push(mbps);
        process.stderr.write(`round ${round + 1}/${rounds} ${mode}: ${mbps.toFixed(0)} MB/s\n`);
      }
    }
  } finally {
    raw.close();
    await fylr.close();
    registry.close();
  }
  const params = {
    bytes: total,
    rounds,
    pick: "median",
    unit: "MB/s (1e6 bytes)",
    better: "higher",
    path: "fylr GET in-pipe → runJob(cat) in a child process → chunked PUT out-pipe (HTTP/1.1)",
    runner: "src/execserver/runner runJob",
  };
  emit({
    bench: "pipe-throughput",
    metric: "MB_per_s",
    value: median(samples.runjob),
    baseline: "raw node:http GET + PUT relay, no cat",
    baseline_value: median(samples.raw),
    params,
  });
  emit({
    bench: "pipe-throughput",
    metric: "MB_per_s_vs_raw_cat",
    value: median(samples.runjob),
    baseline: "raw node:http GET → cat → PUT relay",
    baseline_value: median(samples["raw-cat"]),
    params,
  });
  emit({
    bench: "pipe-throughput",
    metric: "MB_per_s_pipe_server_only",
    value: median(samples["pipes-relay"]),
    baseline: "raw node:http GET + PUT relay, no cat",
    baseline_value: median(samples.raw),
    params: { ...params, path: "fylr GET in-pipe → raw node:http relay in a child process (no cat, no runner) → PUT out-pipe" },
  });
}

if (process.argv[2] === "--relay") {
  const [, , , mode, inUrl, outUrl] = process.argv;
  await relayMain(mode as Mode, inUrl!, outUrl!);
} else {
  await main();
}
