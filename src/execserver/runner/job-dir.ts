import { mkdirSync, mkdtempSync, rmdir, rmSync, writeFileSync } from "node:fs";
import { rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { Logger } from "../../shared/log.js";
import { thisProcess } from "./job-dir-owner.js";
import { JOB_DIR_PREFIX, removeWhenGone } from "./group-watchdog.js";

/** Names of the directories of one execserver process's job directories: "slotbroker-jobs-PID-XXXXXX". */
export const OWNER_DIR_PREFIX = "slotbroker-jobs-";
/** The file in an execserver's directory that says who made it (see DirOwner). */
export const OWNER_FILE = "owner.json";

// os.tmpdir() reads the environment on every call; the execserver's does not change.
let defaultRoot: string | undefined;
// root → this process's directory of job directories there.
const ownDirs = new Map<string, string>();
// Job directories are numbered: the directory they go in is this process's own (made
// fresh by mkdtemp, mode 0700), so a number is unique without a random name.
let jobDirs = 0;

/**
 * Makes a job's fresh working directory under this process's own directory in `root`
 * (default os.tmpdir()), made with the first job. Synchronous on purpose: one mkdir(2),
 * far cheaper than a round trip through libuv's thread pool, which on a busy machine
 * added milliseconds to every job.
 */
export function makeJobDir(root: string | undefined, onError: (err: Error) => void): string {
  const base = jobDirRoot(root);
  const own = ownDirs.get(base);
  if (own) {
    try {
      return mkdirFresh(own);
    } catch (err) {
      // Removed from under us (a cleaner of old temp files): make a new one.
      if ((err as { code?: unknown }).code !== "ENOENT") throw err;
      ownDirs.delete(base);
    }
  }
  return mkdirFresh(makeOwnDir(base, onError));
}

/**
 * The path of a job's working directory not made yet, under this process's own directory
 * in `root` (made here when missing): for the job launcher, which makes the directory
 * before the job and removes it after (mkdir and rmdir there, not on this event loop).
 * Should it fail (the own directory was removed meanwhile), makeJobDir recovers.
 */
export function nextJobDir(root: string | undefined, onError: (err: Error) => void): string {
  const base = jobDirRoot(root);
  return join(ownDirs.get(base) ?? makeOwnDir(base, onError), `${JOB_DIR_PREFIX}${++jobDirs}`);
}

function mkdirFresh(own: string): string {
  for (;;) {
    const dir = join(own, `${JOB_DIR_PREFIX}${++jobDirs}`);
    try {
      mkdirSync(dir, { mode: 0o700 });
      return dir;
    } catch (err) {
      // Taken by another writer there (root can): the next number.
      if ((err as { code?: unknown }).code !== "EEXIST") throw err;
    }
  }
}

/**
 * Makes this process's directory of job directories in `base`, with the owner file that
 * lets the next execserver tell it from a live one's (see leftover-jobs.ts), and has the
 * reaper remove it once this process is gone, however it ends.
 */
function makeOwnDir(base: string, onError: (err: Error) => void): string {
  const dir = mkdtempSync(join(base, `${OWNER_DIR_PREFIX}${process.pid}-`));
  try {
    writeFileSync(join(dir, OWNER_FILE), `${JSON.stringify(thisProcess())}\n`, { mode: 0o600 });
  } catch (err) {
    rmSync(dir, { recursive: true, force: true });
    throw err;
  }
  ownDirs.set(base, dir);
  removeWhenGone(dir, onError);
  return dir;
}

/** Where job directories go: `root`, or else os.tmpdir(). */
export function jobDirRoot(root: string | undefined): string {
  return root ?? (defaultRoot ??= tmpdir());
}

const removals = new Set<Promise<void>>();

/**
 * Removes a finished job's directory in the background, off the event loop: the receipt
 * (the DONE) does not wait for it. rmdir(2) can block for milliseconds (a filesystem that
 * discards freed blocks synchronously, a busy disk), and done synchronously it held up
 * every other job's frames too. `by` (the job launcher's removeDir) removes it when it
 * can; else, or when it was left (not empty), one rmdir when the job left the directory
 * empty, else a recursive rm, which reports what is wrong.
 */
export function removeJobDirLater(cwd: string, log: Logger, by?: (cwd: string) => Promise<boolean>): void {
  const here = (): Promise<void> =>
    new Promise<void>((resolve) => {
      rmdir(cwd, (err) => {
        if (!err) return resolve();
        rm(cwd, { recursive: true, force: true, maxRetries: 2 })
          .catch((e: unknown) => log.warn({ err: e, cwd }, "cannot remove job directory"))
          .finally(resolve);
      });
    });
  const removal = by ? by(cwd).then((removed) => (removed ? undefined : here())) : here();
  removals.add(removal);
  void removal.then(() => removals.delete(removal));
}

/** Resolves once every job directory whose removal has begun is gone (or failed to go). */
export async function jobDirsRemoved(): Promise<void> {
  while (removals.size > 0) await Promise.all(removals);
}
