// graphile-worker's runner as the end-to-end bench's children run it (e2e-graphile.ts,
// e2e-floor-app.ts): one task list, LISTEN/NOTIFY for new jobs, no signal handlers, no
// logging, and per finished job one JSON line on stdout with when it started (job:start,
// after get_job) and when its result was written (job:complete), epoch ms:
//   {"job":ID,"ok":true,"started":…,"settled":…}
import { performance } from "node:perf_hooks";
import { Logger, run, type Runner, type TaskList } from "graphile-worker";

export const epochMs = (): number => performance.timeOrigin + performance.now();

/** Starts the runner; its job lines go out batched, one write per turn of the event loop. */
export async function runReportingWorker(connectionString: string, concurrency: number, taskList: TaskList): Promise<Runner> {
  const started = new Map<string, number>();
  const out: string[] = [];
  const flush = (): void => void process.stdout.write(out.splice(0).join(""));
  const runner = await run({
    connectionString,
    concurrency,
    maxPoolSize: concurrency + 2,
    noHandleSignals: true,
    logger: new Logger(() => () => undefined),
    taskList,
  });
  runner.events.on("job:start", ({ job }) => void started.set(job.id, epochMs()));
  runner.events.on("job:complete", ({ job, error }) => {
    if (out.push(`${JSON.stringify({ job: job.id, ok: !error, started: started.get(job.id), settled: epochMs() })}\n`) === 1) setImmediate(flush);
    started.delete(job.id);
  });
  return runner;
}
