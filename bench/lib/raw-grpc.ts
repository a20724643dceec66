// The baselines' raw transport: a grpc-js bidi echo service with identity (de)serializers,
// run in its own process so the baseline crosses the same process boundary as the broker.
import { spawn, type ChildProcess } from "node:child_process";
import { fileURLToPath } from "node:url";
import * as grpc from "@grpc/grpc-js";
import { waitForOutput } from "../../harness/child-output.js";
import { identity, rawBidiService } from "./raw-bidi.js";
import { bindServer } from "../../src/shared/grpc.js";
import { nodeScript } from "../../harness/node-children.js";

/** Method path of the echo stream. */
export const echoPath = "/bench.Echo/Pingpong";


/** The script that serves the echo service; start it with `startChild([echoServerScript])`. */
export const echoServerScript = fileURLToPath(new URL("./echo-server.ts", import.meta.url));

/** Serves the echo stream on a free loopback port and prints `echo listening grpc=ADDR`. */
export async function serveEcho(): Promise<void> {
  const server = new grpc.Server();
  server.addService(rawBidiService("pingpong", echoPath), {
    pingpong: (call: grpc.ServerDuplexStream<Buffer, Buffer>) => {
      call.on("data", (b: Buffer) => call.write(b));
      call.on("end", () => call.end());
    },
  });
  const port = await bindServer(server, "127.0.0.1:0", grpc.ServerCredentials.createInsecure());
  process.stdout.write(`echo listening grpc=127.0.0.1:${port}\n`);
  process.on("SIGTERM", () => server.forceShutdown());
}

/** Opens one raw echo stream on a channel of its own (its own TCP connection). */
export function openEchoStream(address: string): { client: grpc.Client; call: grpc.ClientDuplexStream<Buffer, Buffer> } {
  const client = new grpc.Client(address, grpc.credentials.createInsecure(), { "grpc.use_local_subchannel_pool": 1 });
  return { client, call: client.makeBidiStreamRequest(echoPath, identity, identity) };
}

/**
 * Runs a TypeScript script in a child process and resolves with the address it prints on
 * stdout (the first match of `pattern`), e.g. an execserver or the echo server. The child
 * runs from the run's compiled build when there is one (harness/node-children.ts; `npm run
 * bench` makes one), else through tsx.
 * BENCH_CHILD_NODE_ARGS adds node flags to every child, e.g. to profile the server side:
 *   BENCH_CHILD_NODE_ARGS="--cpu-prof --cpu-prof-dir=/tmp/prof" npm run bench -- cycle-throughput
 * `extraNodeArgs` (space-separated) go to this child alone, after those.
 */
export async function startChild(args: string[], pattern = /grpc=(\S+)/, extraNodeArgs = "", env?: NodeJS.ProcessEnv): Promise<{ child: ChildProcess; address: string }> {
  const nodeArgs = `${process.env.BENCH_CHILD_NODE_ARGS ?? ""} ${extraNodeArgs}`.split(" ").filter(Boolean);
  const [script, ...rest] = args;
  const child = spawn(process.execPath, [...nodeArgs, ...nodeScript(script!), ...rest], { stdio: ["ignore", "pipe", "inherit"], env: env && { ...process.env, ...env } });
  const m = await waitForOutput(child, pattern, { timeoutMs: 60_000 });
  return { child, address: m[1]! };
}
