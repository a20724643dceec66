// memory: server heap per broker connection and per parked want. The execserver runs in
// this process; a child process opens the connections and parks the wants; the heap is
// measured after a full GC at each step. Baselines are the budgets in bench/README.md.
//   npm run bench -- memory            (MEMORY_CONNECTIONS, MEMORY_WANTS to resize)
import { spawn } from "node:child_process";
import { createInterface } from "node:readline";
import { fileURLToPath } from "node:url";
import { setFlagsFromString } from "node:v8";
import { runInNewContext } from "node:vm";
import { compileExecserverConfig } from "../src/execserver/index.js";
import { startExecserver } from "../src/app/execserver.js";
import { sleep } from "../src/shared/abort.js";
import { emit } from "./lib/figure.js";
import { nodeScript } from "../harness/node-children.js";

const connections = Number(process.env.MEMORY_CONNECTIONS ?? 1000);
const wants = Number(process.env.MEMORY_WANTS ?? 200_000);

setFlagsFromString("--expose-gc");
const gc = runInNewContext("gc") as () => void;

async function heapAfterGc(): Promise<number> {
  for (let i = 0; i < 3; i++) {
    gc();
    await sleep(50);
  }
  return process.memoryUsage().heapUsed;
}

// One slot, taken by the first want and never answered (long offer timeout), so every
// other want stays parked.
const handle = await startExecserver(
  compileExecserverConfig({
    listen: "127.0.0.1:0",
    adminListen: "127.0.0.1:0",
    offerTimeout: "10m",
    maxWantsPerConnection: wants,
    waitgroups: { bench: { processes: 1 } },
    services: { noop: { waitgroup: "bench", builtin: "noop" } },
  }),
);
const waiting = (): number => Number(handle.status().waitgroups[0]!.waiting);
const connected = (): number => handle.status().connections.length;

const before = await heapAfterGc();
const script = fileURLToPath(new URL("./lib/memory-client.ts", import.meta.url));
const child = spawn(process.execPath, [...nodeScript(script), handle.grpcAddress, String(connections), String(wants)], {
  stdio: ["pipe", "pipe", "inherit"],
});
const lines = createInterface({ input: child.stdout });
await new Promise<void>((resolve) => lines.on("line", (l) => l === "connected" && resolve()));
while (connected() < connections) await sleep(50);
const withConnections = await heapAfterGc();
while (waiting() < wants - 1) await sleep(100);
const withWants = await heapAfterGc();
child.stdin.end();
await new Promise((resolve) => child.once("exit", resolve));
await handle.forceClose();

const params = { connections, wants, measure: "heapUsed after GC, server process", better: "lower" };
emit({
  bench: "memory",
  metric: "bytes_per_connection",
  value: (withConnections - before) / connections,
  baseline: "64 KiB budget per connection",
  baseline_value: 64 * 1024,
  params,
});
emit({
  bench: "memory",
  metric: "bytes_per_parked_want",
  value: (withWants - withConnections) / (wants - 1),
  baseline: "1 KiB budget per parked want",
  baseline_value: 1024,
  params,
});
