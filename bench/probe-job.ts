import { mkdtempSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { create } from "@bufbuild/protobuf";
import { JobSpecSchema } from "../gen/slotbroker/v1/broker_pb.js";
import { BrokerClient, brokerSlot, compileBrokerConfig } from "../src/fylr/broker/index.js";
import { startChild } from "./lib/raw-grpc.js";
import { nowUs, percentile } from "./lib/figure.js";
import { readFileSync } from "node:fs";
const cpuMs = (pid: number) => { const f = readFileSync(`/proc/${pid}/stat`, "utf8").split(") ")[1]!.split(" "); return (Number(f[11]) + Number(f[12])) * 10; };
const rssMb = (pid: number) => (Number(readFileSync(`/proc/${pid}/statm`, "utf8").split(" ")[1]) * 4096) / 1e6;
const dir = mkdtempSync(join(tmpdir(), "probe-"));
const config = join(dir, "exec.yaml");
writeFileSync(config, `jobLauncher: ${process.env.PROBE_LAUNCHER ?? "true"}\n` + "listen: 127.0.0.1:0\nadminListen: 127.0.0.1:0\nwaitgroups: {w: {processes: 2}}\nservices: {noop: {waitgroup: w, builtin: noop}, t: {waitgroup: w, command: [\"true\"]}}\n");
const cli = process.env.PROBE_DIST ? join(process.cwd(), "dist/src/cli.js") : join(process.cwd(), "src/cli.ts");
const exec = await startChild([cli, "execserver", "--config", config]);
const broker = new BrokerClient(compileBrokerConfig({ addresses: [exec.address], clientName: "p", maxConnectionsPerAddress: 1 }));
broker.start();
while (broker.instances().length === 0) await new Promise((r) => setTimeout(r, 10));
for (const service of ["noop", "t", "noop", "t"]) {
  const acq: number[] = [], run: number[] = [];
  const c0 = cpuMs(exec.child.pid!);
  const N = Number(process.env.PROBE_N ?? 300);
  for (let i = 0; i < N; i++) {
    const t0 = nowUs();
    const slot = brokerSlot(await broker.acquire({ service }));
    const t1 = nowUs();
    await slot.start(create(JobSpecSchema, {}));
    const t2 = nowUs();
    acq.push(t1 - t0); run.push(t2 - t1);
  }
  const s = (a: number[]) => a.sort((x, y) => x - y) && `p50 ${percentile(a, 50).toFixed(0)} p90 ${percentile(a, 90).toFixed(0)}`;
  console.log(service, process.env.BENCH_CHILD_NODE_ARGS ?? "", "acquire µs", s(acq), "| JOB→DONE µs", s(run), `| exec cpu/job ${((cpuMs(exec.child.pid!) - c0) / N).toFixed(2)} ms rss ${rssMb(exec.child.pid!).toFixed(0)} MB`);
}
exec.child.kill(); process.exit(0);
