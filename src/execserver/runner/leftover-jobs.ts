import { lstat, readdir, readFile, readlink, realpath, rm } from "node:fs/promises";
import { join } from "node:path";
import { performance } from "node:perf_hooks";
import { setTimeout as sleep } from "node:timers/promises";
import type { Logger } from "../../shared/log.js";
import { OWNER_DIR_PREFIX, OWNER_FILE } from "./job-dir.js";
import { ownerVerdict, parseOwner, probeProcess, procStat, thisProcess } from "./job-dir-owner.js";
import { signalGroup } from "./process-group.js";

/** What a sweep found and did. */
export interface SweepResult {
  /** Directories of dead execservers, removed (or tried). */
  readonly dirs: readonly string[];
  /** Processes found working in them, SIGKILLed (with their job's process group). */
  readonly killed: readonly number[];
  /** Killed processes still alive when the sweep stopped waiting for them. */
  readonly survivors: readonly number[];
}

/** Options of sweepLeftoverJobs (tests shorten the timings). */
export interface SweepOptions {
  /** How long to wait for killed processes to be gone (default 5 s). */
  readonly waitMs?: number;
  /** A directory without an owner file is someone's in the making for this long (default 60 s). */
  readonly youngMs?: number;
}

/**
 * Removes what execservers that are gone left in `root`: their directories of job
 * directories, after SIGKILLing every process still working in one (and that job's
 * process group), and waits (bounded) until those are gone. Normally the reaper did all
 * that when its execserver died; this covers a reaper that died too. A directory whose
 * maker still runs, or cannot be judged from here (another pid namespace), or that is not
 * ours (another user's), is never touched: two execservers on one host never sweep each
 * other's live jobs. Never rejects: what fails is logged.
 */
export async function sweepLeftoverJobs(root: string, log: Logger, options: SweepOptions = {}): Promise<SweepResult> {
  const dirs = await deadOwnersDirs(root, options.youngMs ?? 60_000, log);
  if (dirs.length === 0) return { dirs, killed: [], survivors: [] };
  const killed = await killWorkingIn(dirs, log);
  const survivors = await untilGone(killed, options.waitMs ?? 5_000);
  for (const dir of dirs) {
    await rm(dir, { recursive: true, force: true, maxRetries: 2 }).catch((err: unknown) => log.warn({ err, dir }, "cannot remove a dead execserver's job directories"));
  }
  log.warn(
    { dirs, killed: killed.length, survivors: survivors.length ? survivors : undefined },
    "removed what an execserver that is gone left: its job directories, and the job processes still running in them",
  );
  return { dirs, killed, survivors };
}

/** The directories in `root` whose maker is gone, as real paths (what /proc/PID/cwd shows). */
async function deadOwnersDirs(root: string, youngMs: number, log: Logger): Promise<string[]> {
  let names: string[];
  try {
    names = (await readdir(root)).filter((n) => n.startsWith(OWNER_DIR_PREFIX));
  } catch (err) {
    if ((err as { code?: unknown }).code !== "ENOENT") log.warn({ err, root }, "cannot look for job directories execservers left");
    return [];
  }
  const here = thisProcess();
  const uid = process.getuid?.();
  const dead: string[] = [];
  for (const name of names) {
    const dir = join(root, name);
    try {
      const st = await lstat(dir);
      if (!st.isDirectory() || (uid !== undefined && st.uid !== uid)) continue;
      const owner = parseOwner(await readOwnerFile(join(dir, OWNER_FILE)));
      // No owner file yet: one being made this moment, or a maker that died right then.
      const verdict = owner ? ownerVerdict(owner, here, probeProcess) : Date.now() - st.mtimeMs > youngMs ? "dead" : "alive";
      if (verdict === "dead") dead.push(await realpath(dir));
    } catch (err) {
      if ((err as { code?: unknown }).code !== "ENOENT") log.warn({ err, dir }, "cannot judge a directory of job directories");
    }
  }
  return dead;
}

/** An owner file's text; "" when it is missing or not a small regular file (a FIFO would block a read). */
async function readOwnerFile(path: string): Promise<string> {
  try {
    const st = await lstat(path);
    return st.isFile() && st.size <= 4096 ? await readFile(path, "utf8") : "";
  } catch {
    return "";
  }
}

/**
 * SIGKILLs every process whose working directory is in one of `dirs`: a job's leader, or
 * what it started there. When that process is in a job's process group (a job leads a
 * session of its own), the whole group goes, so children that moved elsewhere go too.
 * Returns every process signalled, the groups' other members included.
 */
async function killWorkingIn(dirs: readonly string[], log: Logger): Promise<number[]> {
  const own = procStat("self");
  const mine = new Set([process.pid, Number(own?.[2]), Number(own?.[3])]);
  const killed = new Set<number>();
  const groups = new Set<number>();
  for (const pid of await processIds()) {
    if (mine.has(pid)) continue;
    let cwd: string;
    try {
      cwd = (await readlink(`/proc/${pid}/cwd`)).replace(/ \(deleted\)$/, "");
    } catch {
      continue; // gone, or not ours to look at
    }
    if (!dirs.some((d) => cwd === d || cwd.startsWith(`${d}/`))) continue;
    const stat = procStat(pid);
    const [pgid, sid] = [Number(stat?.[2]), Number(stat?.[3])];
    try {
      if (pgid > 1 && pgid === sid && !mine.has(pgid) && signalGroup(pgid, "SIGKILL")) groups.add(pgid);
      process.kill(pid, "SIGKILL");
      killed.add(pid);
    } catch (err) {
      if ((err as { code?: unknown }).code !== "ESRCH") log.warn({ err, pid, cwd }, "cannot kill a job an execserver that is gone left");
    }
  }
  if (groups.size > 0) {
    for (const pid of await processIds()) if (groups.has(Number(procStat(pid)?.[2]))) killed.add(pid);
  }
  return [...killed];
}

/** The ids of every process (none without /proc). */
async function processIds(): Promise<number[]> {
  try {
    return (await readdir("/proc")).filter((e) => /^\d+$/.test(e)).map(Number);
  } catch {
    return [];
  }
}

/** Waits until none of `pids` lives (a zombie counts as gone); returns those that still do. */
async function untilGone(pids: readonly number[], waitMs: number): Promise<number[]> {
  const deadline = performance.now() + waitMs;
  let left = [...pids];
  for (;;) {
    left = left.filter((pid) => probeProcess(pid) !== undefined);
    if (left.length === 0 || performance.now() > deadline) return left;
    await sleep(10);
  }
}
