// cycle-throughput: full WANT → OFFER → JOB → DONE cycles per second through the fylr's
// broker client (src/fylr/broker: acquire + Slot.start), 50 connections (50 broker
// clients, one connection each) against one execserver (the real CLI, its own process) with
// 50 slots of the builtin noop service. A cycle is two round trips, so the baseline is raw
// grpc-js bidi round trips per second over 50 connections to an echo server in another
// process, ÷ 2, measured in the same run in alternating blocks. Goal (bench/README.md): ≥ 0.6.
// Also reported (params): CPU µs per cycle and per raw round trip, client and server process
// apart (process.cpuUsage, /proc): on a loaded machine the wall-clock ratio swings with
// whatever else runs, while the CPU spent per operation stays put.
//   npm run bench -- cycle-throughput
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { create } from "@bufbuild/protobuf";
import type * as grpc from "@grpc/grpc-js";
import { JobSpecSchema } from "../gen/slotbroker/v1/broker_pb.js";
import { BrokerClient, brokerSlot, compileBrokerConfig } from "../src/fylr/broker/index.js";
import { cpuMs } from "./lib/proc-cpu.js";
import { echoServerScript, openEchoStream, startChild } from "./lib/raw-grpc.js";
import { emit } from "./lib/figure.js";

const connections = 50;
const blocks = 3;
const blockMs = 2_000;
const warmupMs = 1_000;



/** 50 raw bidi streams, each on its own channel, doing sequential round trips. */
class RawFleet {
  private readonly streams: { client: grpc.Client; call: grpc.ClientDuplexStream<Buffer, Buffer> }[] = [];

  constructor(address: string) {
    for (let i = 0; i < connections; i++) {
      const { client, call } = openEchoStream(address);
      call.on("error", () => undefined);
      this.streams.push({ client, call });
    }
  }

  /** Round trips completed over `ms`, all streams together. */
  async run(ms: number): Promise<number> {
    const payload = Buffer.alloc(32, 7);
    const deadline = Date.now() + ms;
    let count = 0;
    await Promise.all(
      this.streams.map(
        ({ call }) =>
          new Promise<void>((resolve) => {
            const onData = (): void => {
              count++;
              if (Date.now() >= deadline) {
                call.off("data", onData);
                resolve();
              } else call.write(payload);
            };
            call.on("data", onData);
            call.write(payload);
          }),
      ),
    );
    return count;
  }

  close(): void {
    for (const { client, call } of this.streams) {
      call.cancel();
      client.close();
    }
  }
}

/** Cycles completed over `ms` by every broker client looping acquire → JOB → DONE. */
async function cycles(brokers: BrokerClient[], ms: number): Promise<number> {
  const spec = create(JobSpecSchema, {});
  const deadline = Date.now() + ms;
  let count = 0;
  await Promise.all(
    brokers.map(async (broker) => {
      while (Date.now() < deadline) {
        const slot = brokerSlot(await broker.acquire({ service: "noop" }));
        const receipt = await slot.start(spec);
        if (receipt.exitCode !== 0) throw new Error(`noop failed: ${receipt.errorMessage}`);
        count++;
      }
    }),
  );
  return count;
}

async function main(): Promise<void> {
  const dir = mkdtempSync(join(tmpdir(), "bench-cycle-throughput-"));
  const config = join(dir, "exec.yaml");
  writeFileSync(
    config,
    `listen: 127.0.0.1:0\nadminListen: 127.0.0.1:0\nwaitgroups: {bench: {processes: ${connections}}}\nservices: {noop: {waitgroup: bench, builtin: noop}}\n`,
  );
  const here = fileURLToPath(import.meta.url);
  const exec = await startChild([join(here, "..", "..", "src", "cli.ts"), "execserver", "--config", config]);
  const echo = await startChild([echoServerScript]);
  const brokers = Array.from({ length: connections }, (_, i) => {
    const broker = new BrokerClient(compileBrokerConfig({ addresses: [exec.address], clientName: `fylr-${i}`, maxConnectionsPerAddress: 1 }));
    broker.start();
    return broker;
  });
  const raw = new RawFleet(echo.address);
  try {
    while (brokers.some((b) => b.instances().length === 0)) await new Promise((r) => setTimeout(r, 10));
    await cycles(brokers, warmupMs);
    await raw.run(warmupMs);
    let cycleCount = 0;
    let rawCount = 0;
    const cpu = { rawClient: 0, rawServer: 0, cycleClient: 0, cycleServer: 0 };
    // CPU ms of this process and of `pid` while `fn` runs.
    const metered = async (pid: number | undefined, fn: () => Promise<number>): Promise<[number, number, number]> => {
      const [client, server] = [process.cpuUsage(), cpuMs(pid)];
      const count = await fn();
      const used = process.cpuUsage(client);
      return [count, (used.user + used.system) / 1000, cpuMs(pid) - server];
    };
    for (let b = 0; b < blocks; b++) {
      const [r, rc, rs] = await metered(echo.child.pid, () => raw.run(blockMs));
      const [c, cc, cs] = await metered(exec.child.pid, () => cycles(brokers, blockMs));
      rawCount += r;
      cycleCount += c;
      cpu.rawClient += rc;
      cpu.rawServer += rs;
      cpu.cycleClient += cc;
      cpu.cycleServer += cs;
    }
    const us = (ms: number, n: number): number => Math.round((ms * 1000) / n);
    const seconds = (blocks * blockMs) / 1000;
    emit({
      bench: "cycle-throughput",
      metric: "cycles_per_s",
      value: cycleCount / seconds,
      baseline: "grpc-js raw bidi round trips/s ÷ 2 (same 50 connections)",
      baseline_value: rawCount / seconds / 2,
      params: {
        connections,
        slots: connections,
        service: "builtin noop",
        client: "fylr BrokerClient.acquire + Slot.start",
        server: "separate process",
        seconds,
        raw_round_trips_per_s: Math.round(rawCount / seconds),
        cpu_us_per_cycle: { client: us(cpu.cycleClient, cycleCount), server: us(cpu.cycleServer, cycleCount) },
        cpu_us_per_raw_round_trip: { client: us(cpu.rawClient, rawCount), server: us(cpu.rawServer, rawCount) },
        better: "higher",
        goal: "≥ 0.6",
      },
    });
  } finally {
    raw.close();
    await Promise.all(brokers.map((b) => b.close()));
    exec.child.kill("SIGTERM");
    echo.child.kill("SIGTERM");
    rmSync(dir, { recursive: true, force: true });
  }
}

await main();
