// The end-to-end bench's baseline worker, in its own process: graphile-worker (run() as
// shipped, LISTEN/NOTIFY for new jobs) whose one task spawns the job's command with the
// job's stdin and collects its stdout, as a user would build it instead of slotbroker.
// Prints, per finished job, when it started (job:start, after get_job) and when its
// result was written (job:complete), epoch ms:
//   {"job":ID,"ok":true,"started":…,"settled":…}
// argv: connection string, concurrency.
import { spawn } from "node:child_process";
import { performance } from "node:perf_hooks";
import { Logger, run, type Task } from "graphile-worker";

const epochMs = (): number => performance.timeOrigin + performance.now();
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

const started = new Map<string, number>();
// Lines finished in one turn of the event loop go out in one write.
const out: string[] = [];
const flush = (): void => void process.stdout.write(out.splice(0).join(""));
const runner = await run({
  connectionString,
  concurrency,
  maxPoolSize: concurrency + 2,
  noHandleSignals: true,
  logger: new Logger(() => () => undefined),
  taskList: { exec },
});
runner.events.on("job:start", ({ job }) => void started.set(job.id, epochMs()));
runner.events.on("job:complete", ({ job, error }) => {
  if (out.push(`${JSON.stringify({ job: job.id, ok: !error, started: started.get(job.id), settled: epochMs() })}\n`) === 1) setImmediate(flush);
  started.delete(job.id);
});
process.stdout.write("e2e-graphile ready\n");
process.on("SIGTERM", () => {
  void runner.stop().finally(() => process.exit(0));
});
