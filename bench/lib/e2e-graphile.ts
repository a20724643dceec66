// The end-to-end bench's baseline worker, in its own process: graphile-worker (run() as
// shipped, LISTEN/NOTIFY for new jobs) whose one task spawns the job's command with the
// job's stdin and collects its stdout, as a user would build it instead of slotbroker.
// Prints, per finished job, when it started (job:start, after get_job) and when its
// result was written (job:complete), epoch ms:
//   {"job":ID,"ok":true,"started":…,"settled":…}
// argv: connection string, concurrency.
import { spawn } from "node:child_process";
import type { Task } from "graphile-worker";
import { runReportingWorker } from "./graphile-reporting.js";

const [connectionString, concurrency] = [process.argv[2]!, Number(process.argv[3] ?? 4)];

/** Payload of the "exec" task: argv and the stdin bytes (base64). */
interface ExecPayload {
  readonly command: string[];
  readonly stdin: string;
}

const exec: Task = (payload) => {
  const { command, stdin } = payload as ExecPayload;
  return new Promise<void>((resolve, reject) => {
    const child = spawn(command[0]!, command.slice(1), { stdio: ["pipe", "pipe", "ignore"] });
    const chunks: Buffer[] = [];
    child.stdout.on("data", (chunk: Buffer) => chunks.push(chunk));
    child.on("error", reject);
    child.on("close", (code) => (code === 0 ? resolve() : reject(new Error(`${command[0]} exited with ${code}`))));
    child.stdin.on("error", () => undefined);
    child.stdin.end(Buffer.from(stdin, "base64"));
  });
};

const runner = await runReportingWorker(connectionString, concurrency, { exec });
process.stdout.write("e2e-graphile ready\n");
process.on("SIGTERM", () => {
  void runner.stop().finally(() => process.exit(0));
});
