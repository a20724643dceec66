import { spawn, type ChildProcess } from "node:child_process";
import { ErrorKind, type Receipt } from "../../../gen/slotbroker/v1/broker_pb.js";
import { AbortReason } from "../../shared/abort.js";
import { silentLogger, type Logger } from "../../shared/log.js";
import { childEnv } from "./child-env.js";
import { batchReaperLines, watchForkIn } from "./group-watchdog.js";
import { jobDirRoot, makeJobDir, nextJobDir, removeJobDirLater } from "./job-dir.js";
import type { JobLauncher } from "./job-launcher.js";
import { receiptNotRun } from "./receipt.js";
import { checkRequest } from "./request-check.js";
import { RunningJob } from "./running-job.js";
import type { JobProcess, RunJob, RunRequest } from "./types.js";

/** Options for createRunJob. */
export interface RunnerOptions {
  /** Where the runner logs (default: silent). */
  readonly logger?: Logger;
  /** PATH given to jobs whose env has none (default: the execserver's own PATH). */
  readonly hostPath?: string;
  /**
   * Who starts the jobs: a JobLauncher (the execserver passes the shared one when its
   * `jobLauncher` config asks for it, Linux only), or false (the default) to spawn from
   * this process.
   */
  readonly launcher?: JobLauncher | false;
}

/** Makes a RunJob bound to a logger; the execserver wires this one in. */
export function createRunJob(options: RunnerOptions = {}): RunJob {
  const log = (options.logger ?? silentLogger).child({ component: "runner" });
  const launcher = options.launcher ?? false;
  return async (request) => {
    try {
      return await runInTempDir(request, log, options.hostPath ?? process.env.PATH, launcher);
    } catch (err) {
      // Unreachable by design; RunJob must never reject, so a bug still yields a receipt.
      log.error({ err }, "runner failed unexpectedly");
      return receiptNotRun({ kind: ErrorKind.UNSPECIFIED, message: `internal runner error: ${String(err)}` });
    }
  };
}

/** Runs one job with a silent logger and the execserver's PATH; never rejects. */
export const runJob: RunJob = createRunJob();

async function runInTempDir(request: RunRequest, log: Logger, hostPath: string | undefined, launcher: JobLauncher | false): Promise<Receipt> {
  const invalid = checkRequest(request);
  if (invalid) return receiptNotRun(invalid);
  if (request.signal.aborted) {
    const requested = request.signal.reason instanceof AbortReason && request.signal.reason.kind === "cancel-requested";
    return receiptNotRun({ kind: requested ? ErrorKind.CANCEL_REQUESTED : ErrorKind.CANCELLED, message: "cancelled before start" });
  }
  const dir = new JobDir(request.tempRoot, log, launcher);
  try {
    return await runIn(dir, request, log, hostPath, launcher);
  } catch (err) {
    if (!(err instanceof JobDirError)) throw err;
    return receiptNotRun({ kind: ErrorKind.SPAWN_FAILED, message: `cannot create a working directory under ${jobDirRoot(request.tempRoot)}: ${String(err.cause)}` });
  } finally {
    dir.remove();
  }
}

class JobDirError extends Error {}

/**
 * A job's working directory: made here (makeJobDir), or named here and made by the job
 * launcher (a mkdir fewer on this event loop per job); removed after the job by the
 * launcher, when there is one, else here.
 */
class JobDir {
  readonly #root: string | undefined;
  readonly #log: Logger;
  readonly #removeBy: ((path: string) => Promise<boolean>) | undefined;
  #path: string | undefined;

  constructor(root: string | undefined, log: Logger, launcher: JobLauncher | false) {
    this.#root = root;
    this.#log = log;
    this.#removeBy = launcher ? (path) => launcher.removeDir(path) : undefined;
  }

  #onReaperError = (err: Error): void => this.#log.warn({ err }, "cannot start the job reaper");

  /** Makes the directory here; throws a JobDirError when it cannot. */
  make(): string {
    return this.#take(makeJobDir);
  }

  /** Names a directory for the launcher to make; throws a JobDirError when it cannot. */
  name(): string {
    return this.#take(nextJobDir);
  }

  #take(pick: (root: string | undefined, onReaperError: (err: Error) => void) => string): string {
    try {
      this.#path = pick(this.#root, this.#onReaperError);
    } catch (err) {
      throw new JobDirError("cannot create a working directory", { cause: err });
    }
    return this.#path;
  }

  /** The launcher could not make it: nothing to remove. */
  gone(): void {
    this.#path = undefined;
  }

  /** Removes it after the job (in the background). */
  remove(): void {
    if (this.#path !== undefined) removeJobDirLater(this.#path, this.#log, this.#removeBy);
  }
}

async function runIn(dir: JobDir, request: RunRequest, log: Logger, hostPath: string | undefined, launcher: JobLauncher | false): Promise<Receipt> {
  const [file = "", ...fixedArgs] = request.command;
  // A job without stdin reads /dev/null: empty either way, and one pipe and its stream fewer.
  const stdin = request.stdin !== undefined || !!request.stdinUrl || !!request.stdinInline?.byteLength;
  // The launcher reads stdout: all of it when it has nowhere to go but the receipt, else until
  // it outgrows the receipt (then it passes the pipe on): most jobs print little.
  const stdout = request.stdout !== undefined || !!request.stdoutUrl ? ("spill" as const) : false;
  // Inline stdin (when no stream comes first) is written by the native launcher: no handle.
  const input = request.stdin === undefined && request.stdinInline?.byteLength ? request.stdinInline : undefined;
  const args = [...fixedArgs, ...request.args];
  const env = childEnv(request.env, hostPath);
  const onWatchError = (err: Error): void => log.warn({ err }, "cannot watch the job's process group");
  let started: { process: JobProcess } | { error: Error; dir?: boolean } | undefined;
  let forked = noop;
  try {
    if (launcher && launcher.ready()) {
      const cwd = dir.name();
      forked = watchForkIn(cwd, onWatchError);
      const launched = launcher.launch({ file, args, cwd, env, stdin, stdout, input, dir: true });
      started = launched && (await launched);
      // Not started there, nothing made there: the directory is made here, the job started again.
      if (!started || ("error" in started && started.dir)) {
        dir.gone();
        forked();
        forked = noop;
        started = undefined;
      }
    }
    if (!started) {
      const cwd = dir.make();
      forked = watchForkIn(cwd, onWatchError);
      const spec = { file, args, cwd, env, stdin, stdout, input };
      const launched = launcher && launcher.launch(spec);
      started = launched ? await launched : await spawnHere(spec);
    }
  } catch (err) {
    forked();
    throw err;
  }
  if ("error" in started) {
    forked();
    return receiptNotRun({ kind: ErrorKind.SPAWN_FAILED, message: spawnMessage(file, started.error) });
  }
  const child = started.process;
  // The group's "+PGID" and the directory's "=DIR" go to the reaper in one write.
  const job = batchReaperLines(() => {
    try {
      request.onSpawn?.(child.pid);
      return new RunningJob(child, request, log, { pid: child.pid, command: file });
    } finally {
      forked();
    }
  });
  return job.run();
}

const noop = (): void => undefined;

/** Spawns the job from this process: the fallback when no launcher is used. */
async function spawnHere(spec: { file: string; args: string[]; cwd: string; env: Record<string, string>; stdin: boolean }): Promise<{ process: JobProcess } | { error: Error }> {
  let child: ChildProcess;
  try {
    // No shell, ever; detached gives the job its own process group to signal as a whole.
    child = spawn(spec.file, spec.args, { cwd: spec.cwd, env: spec.env, detached: true, stdio: [spec.stdin ? "pipe" : "ignore", "pipe", "pipe"] });
  } catch (err) {
    return { error: err as Error };
  }
  const spawnError = await spawned(child);
  if (spawnError) {
    child.stdin?.destroy();
    child.stdout?.destroy();
    child.stderr?.destroy();
    return { error: spawnError };
  }
  return { process: child as JobProcess };
}

/** Resolves with the spawn error, or undefined once the process is running. */
function spawned(child: ChildProcess): Promise<Error | undefined> {
  return new Promise((resolve) => {
    const onError = (err: Error): void => {
      child.off("spawn", onSpawn);
      resolve(err);
    };
    const onSpawn = (): void => {
      child.off("error", onError);
      resolve(undefined);
    };
    child.once("error", onError);
    child.once("spawn", onSpawn);
  });
}

/** "cannot start \"nope\": ENOENT (no such file or directory on PATH)" and the like. */
export function spawnMessage(file: string, err: unknown): string {
  const code = (err as { code?: unknown }).code;
  const hint =
    code === "ENOENT" ? "no such file or directory (looked up on the job's PATH)" : code === "EACCES" ? "permission denied (not executable?)" : undefined;
  const detail = hint ? `${String(code)}: ${hint}` : err instanceof Error ? err.message : String(err);
  return `cannot start ${JSON.stringify(file)}: ${detail}`;
}
