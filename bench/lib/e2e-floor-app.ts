// The end-to-end bench's floor, application side, in its own process: the shape of a
// slotbroker fylr built from bare parts. Submits come over HTTP (POST /submit, JSON
// {"service":"true"|"sha256","stdin":BASE64}, answered {"id":…}) and are queued with
// graphile-worker's addJob; graphile-worker's runner (LISTEN/NOTIFY, CONCURRENCY jobs at a
// time) claims them, and its task sends each job over a raw gRPC stream to an execution
// process (e2e-floor-exec.ts, round-robin over EXEC_ADDRS) and waits for its exit code.
// No protocol of slotbroker's (no WANT/OFFER, no receipts, no pipes, no fairness) is in it:
// what is left is the cost of the two-process shape itself.
// Prints per finished job the same line as e2e-graphile.ts:
//   {"job":ID,"ok":true,"started":…,"settled":…}
// argv: connection string, concurrency, comma-separated exec addresses.
import { createServer } from "node:http";
import * as grpc from "@grpc/grpc-js";
import type { Task } from "graphile-worker";
import { identity } from "./raw-bidi.js";
import { floorExecPath, jobFrame } from "./e2e-floor-frame.js";
import { runReportingWorker } from "./graphile-reporting.js";

const [connectionString, concurrency, execAddrs] = [process.argv[2]!, Number(process.argv[3] ?? 4), process.argv[4]!.split(",")];

const waiting = new Map<number, (code: number) => void>();
const streams = execAddrs.map((address) => {
  const client = new grpc.Client(address, grpc.credentials.createInsecure(), { "grpc.use_local_subchannel_pool": 1 });
  const call = client.makeBidiStreamRequest<Buffer, Buffer>(floorExecPath, identity, identity);
  call.on("data", (frame: Buffer) => {
    const id = frame.readUInt32BE(0);
    const resolve = waiting.get(id);
    waiting.delete(id);
    resolve?.(frame[4]!);
  });
  call.on("error", (err) => process.stderr.write(`e2e-floor-app: exec stream ${address}: ${err.message}\n`));
  return call;
});

/** Payload of the "exec" task: the command byte and the stdin bytes (base64). */
interface FloorPayload {
  readonly command: number;
  readonly stdin: string;
}

let nextFrame = 1;
let nextStream = 0;
const exec: Task = (payload) => {
  const { command, stdin } = payload as FloorPayload;
  const id = nextFrame++;
  const frame = jobFrame(id, command, Buffer.from(stdin, "base64"));
  return new Promise<void>((resolve, reject) => {
    waiting.set(id, (code) => (code === 0 ? resolve() : reject(new Error(`command ${command} exited with ${code}`))));
    streams[nextStream++ % streams.length]!.write(frame);
  });
};

const runner = await runReportingWorker(connectionString, concurrency, { exec });

const server = createServer((req, res) => {
  const chunks: Buffer[] = [];
  req.on("data", (c: Buffer) => chunks.push(c));
  req.on("end", () => {
    const { service, stdin } = JSON.parse(Buffer.concat(chunks).toString()) as { service: string; stdin?: string };
    runner.addJob("exec", { command: service === "sha256" ? 1 : 0, stdin: stdin ?? "" }).then(
      (job) => res.writeHead(200, { "content-type": "application/json" }).end(JSON.stringify({ id: job.id })),
      (err: Error) => res.writeHead(500).end(err.message),
    );
  });
});
server.listen(0, "127.0.0.1", () => {
  const address = server.address();
  const port = typeof address === "object" && address ? address.port : 0;
  process.stdout.write(`e2e-floor-app ready url=http://127.0.0.1:${port}\n`);
});
process.on("SIGTERM", () => {
  server.close();
  void runner.stop().finally(() => process.exit(0));
});
