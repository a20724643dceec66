/**
 * Whether a job's process group still has living members, read from /proc (Linux). A
 * zombie waiting to be reaped counts as gone: it runs nothing and holds no resources but
 * its entry, and in a container the reaper may take its time.
 */
import { readdir, readFile } from "node:fs/promises";

/** Pids of the group's members that are not zombies. */
export async function livingMembers(pgid: number): Promise<number[]> {
  const members: number[] = [];
  for (const entry of await readdir("/proc")) {
    if (!/^\d+$/.test(entry)) continue;
    let stat: string;
    try {
      stat = await readFile(`/proc/${entry}/stat`, "utf8");
    } catch {
      continue; // exited while we looked
    }
    // "pid (comm) state ppid pgrp …"; comm may contain spaces and parentheses.
    const fields = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
    if (Number(fields[2]) === pgid && fields[0] !== "Z") members.push(Number(entry));
  }
  return members;
}

/** Resolves true once no member of the group lives, false if some still do after `timeoutMs`. */
export async function groupGone(pgid: number, timeoutMs = 2000): Promise<boolean> {
  const deadline = performance.now() + timeoutMs;
  for (;;) {
    if ((await livingMembers(pgid)).length === 0) return true;
    if (performance.now() > deadline) return false;
    // SIGKILL is delivered asynchronously; allow it a moment.
    await new Promise((resolve) => setTimeout(resolve, 5));
  }
}
