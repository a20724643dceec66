// Whether a process is still there, read from /proc (Linux): the runner tests check that
// jobs and their children are really gone, not merely signalled.
import { readFile } from "node:fs/promises";

/** True while `pid` is a live process (a zombie waiting to be reaped counts as gone). */
export async function isAlive(pid: number): Promise<boolean> {
  try {
    const stat = await readFile(`/proc/${pid}/stat`, "utf8");
    return stat.slice(stat.lastIndexOf(")") + 2)[0] !== "Z";
  } catch {
    return false;
  }
}

/** Waits until `pid` is gone: a SIGKILL is delivered asynchronously, so allow it a moment. */
export async function isGone(pid: number): Promise<boolean> {
  for (let i = 0; i < 100; i++) {
    if (!(await isAlive(pid))) return true;
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
  return false;
}
