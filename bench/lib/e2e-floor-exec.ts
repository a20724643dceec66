// The end-to-end bench's floor, execution side, in its own process: the least a second
// process can do to run a job for another one. A raw grpc-js bidi stream (identity
// serializers, no protobuf) carries binary frames; each job is spawned as the graphile-worker
// baseline's task spawns it, and its exit code and stdout go back on the stream.
// The frames are described in e2e-floor-frame.ts.
// Prints `e2e-floor-exec listening grpc=ADDR`.
import { spawn } from "node:child_process";
import * as grpc from "@grpc/grpc-js";
import { bindServer } from "../../src/shared/grpc.js";
import { rawBidiService } from "./raw-bidi.js";
import { floorCommands, floorExecPath } from "./e2e-floor-frame.js";

function runFrame(frame: Buffer, reply: (b: Buffer) => void): void {
  const id = frame.readUInt32BE(0);
  const command = floorCommands[frame[4]!] ?? floorCommands[0];
  const child = spawn(command[0], command.slice(1), { stdio: ["pipe", "pipe", "ignore"] });
  const chunks: Buffer[] = [Buffer.alloc(5)];
  child.stdout.on("data", (chunk: Buffer) => chunks.push(chunk));
  child.on("error", () => undefined);
  child.on("close", (code) => {
    chunks[0]!.writeUInt32BE(id, 0);
    chunks[0]![4] = code ?? 255;
    reply(Buffer.concat(chunks));
  });
  child.stdin.on("error", () => undefined);
  child.stdin.end(frame.subarray(5));
}

const server = new grpc.Server();
server.addService(rawBidiService("run", floorExecPath), {
  run: (call: grpc.ServerDuplexStream<Buffer, Buffer>) => {
    call.on("data", (frame: Buffer) => runFrame(frame, (b) => call.write(b)));
    call.on("end", () => call.end());
  },
});
const port = await bindServer(server, "127.0.0.1:0", grpc.ServerCredentials.createInsecure());
process.stdout.write(`e2e-floor-exec listening grpc=127.0.0.1:${port}\n`);
process.on("SIGTERM", () => {
  server.forceShutdown();
  process.exit(0);
});
