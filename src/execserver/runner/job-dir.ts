import { mkdtempSync, rmdir } from "node:fs";
import { rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { Logger } from "../../shared/log.js";

// os.tmpdir() reads the environment on every call; the execserver's does not change.
let defaultRoot: string | undefined;

/**
 * Makes a job's fresh working directory under `root` (default os.tmpdir()). Synchronous on
 * purpose: one mkdir(2), far cheaper than a round trip through libuv's thread pool, which
 * on a busy machine added milliseconds to every job.
 */
export function makeJobDir(root: string | undefined): string {
  return mkdtempSync(join(jobDirRoot(root), "slotbroker-job-"));
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
 * every other job's frames too. One rmdir when the job left the directory empty, else a
 * recursive rm, which reports what is wrong.
 */
export function removeJobDirLater(cwd: string, log: Logger): void {
  const removal = new Promise<void>((resolve) => {
    rmdir(cwd, (err) => {
      if (!err) return resolve();
      rm(cwd, { recursive: true, force: true, maxRetries: 2 })
        .catch((e: unknown) => log.warn({ err: e, cwd }, "cannot remove job directory"))
        .finally(resolve);
    });
  });
  removals.add(removal);
  void removal.then(() => removals.delete(removal));
}

/** Resolves once every job directory whose removal has begun is gone (or failed to go). */
export async function jobDirsRemoved(): Promise<void> {
  while (removals.size > 0) await Promise.all(removals);
}
