// turnaround: how fast a freed slot reaches the next parked want. One execserver (the real
// CLI, its own process) with one slot of the builtin noop service; two fylr broker clients
// (src/fylr/broker, one connection each) loop acquire → JOB → DONE, so whenever one job is
// DONE the other client's want is parked and gets the OFFER. Timed, as seen by the fylrs:
//   p99_us / p50_us        DONE of job n (one connection) → OFFER of the next want (other)
//   job_to_offer_p99_us    JOB of job n sent → OFFER of the next want (includes a full
//                          round trip and the noop run: the slot's whole idle gap)
// Baseline: a raw grpc-js bidi ping-pong round trip between two processes, measured in
// the same run in alternating blocks. Goal (bench/README.md): p99 ≤ 2× raw.
//   npm run bench -- turnaround
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { create } from "@bufbuild/protobuf";
import { JobSpecSchema } from "../gen/slotbroker/v1/broker_pb.js";
import { BrokerClient, compileBrokerConfig, type BrokerConnection } from "../src/fylr/broker/index.js";
import { echoServerScript, openEchoStream, startChild } from "./lib/raw-grpc.js";
import { emit, nowUs, percentile } from "./lib/figure.js";

const blocks = 10;
const perBlock = 500;
const warmup = 500;



/** Sequential raw bidi round trips; resolves with their times in µs. */
async function rawRoundTrips(address: string, n: number): Promise<number[]> {
  const { client, call } = openEchoStream(address);
  call.on("error", () => undefined);
  let wake: (() => void) | undefined;
  call.on("data", () => wake?.());
  const payload = Buffer.alloc(32, 7);
  const out: number[] = [];
  for (let i = 0; i < n; i++) {
    const start = nowUs();
    await new Promise<void>((resolve) => {
      wake = resolve;
      call.write(payload);
    });
    out.push(nowUs() - start);
  }
  call.cancel();
  client.close();
  return out;
}

/** Two fylrs taking turns on one slot; records DONE→OFFER and JOB→OFFER gaps. */
class Turnaround {
  readonly doneToOffer: number[] = [];
  readonly jobToOffer: number[] = [];
  private lastDone: { conn: BrokerConnection; at: number } | undefined;
  private lastJob: { conn: BrokerConnection; at: number } | undefined;
  private wanted = 0;

  constructor(private readonly brokers: BrokerClient[]) {
    for (const broker of brokers) {
      const conn = broker.pools()[0]!.connections()[0]!;
      conn.on("done", () => (this.lastDone = { conn, at: nowUs() }));
      conn.on("offer", () => {
        const at = nowUs();
        if (this.wanted <= 0) return;
        if (this.lastDone && this.lastDone.conn !== conn) {
          this.doneToOffer.push(at - this.lastDone.at);
          if (this.lastJob && this.lastJob.conn !== conn) this.jobToOffer.push(at - this.lastJob.at);
          this.wanted--;
        }
        this.lastDone = undefined;
      });
    }
  }

  /** Runs until `samples` more gaps were recorded. */
  async run(samples: number): Promise<void> {
    this.wanted = samples;
    this.lastDone = this.lastJob = undefined;
    await Promise.all(this.brokers.map((broker) => this.loop(broker)));
  }

  private async loop(broker: BrokerClient): Promise<void> {
    const spec = create(JobSpecSchema, {});
    const conn = broker.pools()[0]!.connections()[0]!;
    while (this.wanted > 0) {
      const slot = await broker.acquire({ service: "noop" });
      if (this.wanted <= 0) {
        slot.decline();
        break;
      }
      this.lastJob = { conn, at: nowUs() };
      await slot.start(spec);
    }
  }
}

async function main(): Promise<void> {
  const dir = mkdtempSync(join(tmpdir(), "bench-turnaround-"));
  const config = join(dir, "exec.yaml");
  writeFileSync(
    config,
    "listen: 127.0.0.1:0\nadminListen: 127.0.0.1:0\nwaitgroups: {bench: {processes: 1}}\nservices: {noop: {waitgroup: bench, builtin: noop}}\n",
  );
  const here = fileURLToPath(import.meta.url);
  const exec = await startChild([join(here, "..", "..", "src", "cli.ts"), "execserver", "--config", config]);
  const echo = await startChild([echoServerScript]);
  const brokers = ["fylr-a", "fylr-b"].map((clientName) => {
    const broker = new BrokerClient(compileBrokerConfig({ addresses: [exec.address], clientName, maxConnectionsPerAddress: 1 }));
    broker.start();
    return broker;
  });
  try {
    while (brokers.some((b) => b.instances().length === 0)) await new Promise((r) => setTimeout(r, 10));
    const turnaround = new Turnaround(brokers);
    await turnaround.run(warmup);
    await rawRoundTrips(echo.address, warmup);
    turnaround.doneToOffer.length = turnaround.jobToOffer.length = 0;
    const rtts: number[] = [];
    for (let b = 0; b < blocks; b++) {
      rtts.push(...(await rawRoundTrips(echo.address, perBlock)));
      await turnaround.run(perBlock);
    }
    const gaps = [...turnaround.doneToOffer].sort((x, y) => x - y);
    const full = [...turnaround.jobToOffer].sort((x, y) => x - y);
    rtts.sort((x, y) => x - y);
    const params = { samples: gaps.length, blocks, slot: "1 process, builtin noop", fylrs: 2, server: "separate process", better: "lower" };
    const figure = (metric: string, value: number, p: number, extra: Record<string, unknown>): void => {
      emit({ bench: "turnaround", metric, value, baseline: "grpc-js raw bidi rtt", baseline_value: percentile(rtts, p), params: { ...params, ...extra } });
    };
    figure("p99_us", percentile(gaps, 99), 99, { what: "DONE (one fylr) → OFFER (next parked want, other fylr)", goal: "≤ 2" });
    figure("p50_us", percentile(gaps, 50), 50, { what: "DONE → OFFER" });
    figure("job_to_offer_p99_us", percentile(full, 99), 99, { what: "JOB sent → next want's OFFER (one round trip + noop run)" });
    figure("job_to_offer_p50_us", percentile(full, 50), 50, { what: "JOB sent → next want's OFFER" });
  } finally {
    await Promise.all(brokers.map((b) => b.close()));
    exec.child.kill("SIGTERM");
    echo.child.kill("SIGTERM");
    rmSync(dir, { recursive: true, force: true });
  }
}

await main();
