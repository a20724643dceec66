// The processes a load scenario needs (execservers, fylrs, Postgres, k6) and how they all
// stop. Every child inherits SLOTBROKER_LOAD_RUN=<id>, so a final sweep of /proc finds
// anything of this run that is still alive, however it was started.
import { spawn, type ChildProcess } from "node:child_process";
import { mkdtempSync, readdirSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { waitForOutput } from "../harness/child-output.js";

/** Environment marker every process of one `npm run load` inherits. */
export const RUN_MARKER = "SLOTBROKER_LOAD_RUN";

/** A started child with the first stdout line that matched its banner. */
export interface Started {
  readonly name: string;
  readonly child: ChildProcess;
  readonly banner: RegExpExecArray;
  /** The last ~20 kB the process wrote to stderr (its logs), for failure messages. */
  stderr(): string;
}

/** What the supervisor does to stop one thing, in reverse start order. */
interface Stoppable {
  readonly name: string;
  stop(): Promise<void>;
}

/**
 * Owns everything one scenario starts. stopAll() is idempotent and runs on success,
 * failure and Ctrl-C alike: SIGTERM (graceful), then SIGKILL after `graceMs`.
 */
export class Supervisor {
  private readonly owned: Stoppable[] = [];
  private stopping: Promise<string[]> | undefined;

  constructor(private readonly graceMs = 8_000) {}

  /** A temp directory removed by stopAll(). */
  tempDir(prefix: string): string {
    const dir = mkdtempSync(join(tmpdir(), `slotbroker-load-${prefix}-`));
    this.onStop(`temp dir ${dir}`, () => rmSync(dir, { recursive: true, force: true }));
    return dir;
  }

  /**
   * Registers a cleanup (e.g. stopping Postgres); runs in reverse order of registration.
   * Registered after stopAll() (Ctrl-C while a scenario was starting), it runs at once.
   */
  onStop(name: string, stop: () => Promise<void> | void): void {
    if (this.stopping) {
      void this.stopping.then(stop).catch(() => undefined);
      return;
    }
    this.owned.push({ name, stop: async () => stop() });
  }

  /**
   * Spawns `command args` and resolves once a stdout line matches `banner`; rejects (after
   * killing it) when it exits first or `timeoutMs` passes.
   */
  async start(name: string, command: string, args: string[], banner: RegExp, options: { cwd: string; env?: NodeJS.ProcessEnv; timeoutMs?: number }): Promise<Started> {
    if (this.stopping) throw new Error(`${name}: not started, the run is stopping`);
    const child = spawn(command, args, { cwd: options.cwd, env: { ...process.env, ...options.env }, stdio: ["ignore", "pipe", "pipe"] });
    let log = "";
    child.stderr.setEncoding("utf8").on("data", (chunk: string) => {
      log = (log + chunk).slice(-20_000);
    });
    this.owned.push({ name, stop: () => stopChild(child, this.graceMs) });
    const match = await waitForOutput(child, banner, { timeoutMs: options.timeoutMs ?? 30_000 }).catch((err: Error) => {
      throw new Error(`${name}: ${err.message}\n${log.slice(-4_000)}`);
    });
    return { name, child, banner: match, stderr: () => log };
  }

  /** Stops everything (once); resolves with the names of things that failed to stop. */
  stopAll(): Promise<string[]> {
    this.stopping ??= (async () => {
      const failed: string[] = [];
      for (const item of this.owned.reverse()) {
        try {
          await item.stop();
        } catch (err) {
          failed.push(`${item.name}: ${(err as Error).message}`);
        }
      }
      return failed;
    })();
    return this.stopping;
  }
}

/** SIGTERM, then SIGKILL after graceMs; resolves once the child has exited. */
export async function stopChild(child: ChildProcess, graceMs: number): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null) return;
  const exited = new Promise<void>((resolve) => child.once("exit", () => resolve()));
  child.kill("SIGTERM");
  const timer = setTimeout(() => child.kill("SIGKILL"), graceMs);
  await exited;
  clearTimeout(timer);
}

/**
 * Child pids of `pid` (from /proc) whose command line starts with `command`, e.g. the
 * `sleep` jobs an execserver still runs (tsx may keep an esbuild helper child too).
 */
export function childrenOf(pid: number, command: string): number[] {
  return procEntries().filter((p) => parentOf(p) === pid && commandOf(p).split(" ")[0] === command);
}

/**
 * Processes that carry this run's marker and are not this process: leftovers. Kills
 * them (SIGKILL) and returns "pid command" for each, so the run can fail loudly.
 */
export function sweepLeftovers(runId: string): string[] {
  const needle = `${RUN_MARKER}=${runId}`;
  const found: string[] = [];
  for (const pid of procEntries()) {
    if (pid === process.pid) continue;
    let environ: string;
    try {
      environ = readFileSync(`/proc/${pid}/environ`, "latin1");
    } catch {
      continue; // gone, or not ours to read
    }
    if (!environ.split("\0").includes(needle)) continue;
    if (isAncestorOfUs(pid)) continue; // npm / tsx wrappers that started this runner
    found.push(`${pid} ${commandOf(pid)}`);
    try {
      process.kill(pid, "SIGKILL");
    } catch {
      /* already gone */
    }
  }
  return found;
}

function procEntries(): number[] {
  return readdirSync("/proc")
    .filter((d) => /^\d+$/.test(d))
    .map(Number);
}

function parentOf(pid: number): number | undefined {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
    // "pid (comm) state ppid …"; comm may contain spaces and parentheses.
    return Number(stat.slice(stat.lastIndexOf(")") + 2).split(" ")[1]);
  } catch {
    return undefined;
  }
}

/** "pid [state] command line" of a process, for reports. */
export function describeProcess(pid: number): string {
  let state = "?";
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
    state = stat.slice(stat.lastIndexOf(")") + 2).split(" ")[0] ?? "?";
  } catch {
    return `${pid} (gone)`;
  }
  return `${pid} [${state}] ${commandOf(pid)}`;
}

function commandOf(pid: number): string {
  try {
    return readFileSync(`/proc/${pid}/cmdline`, "utf8").split("\0").join(" ").trim().slice(0, 200);
  } catch {
    return "?";
  }
}

function isAncestorOfUs(pid: number): boolean {
  for (let p: number | undefined = process.ppid; p && p > 1; p = parentOf(p)) if (p === pid) return true;
  return false;
}
