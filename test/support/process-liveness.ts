// Whether a process is still there, read from /proc (Linux): the runner tests check that
// jobs and their children are really gone, not merely signalled.
import { readdir, readFile } from "node:fs/promises";

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

/** A live process as /proc tells it. */
export interface ProcessInfo {
  readonly pid: number;
  readonly ppid: number;
  readonly pgid: number;
  readonly sid: number;
  /** argv joined by spaces. */
  readonly cmdline: string;
}

/** Every live (non-zombie) process whose command line satisfies `match`. */
export async function processesWhere(match: (cmdline: string) => boolean): Promise<ProcessInfo[]> {
  const found: ProcessInfo[] = [];
  for (const entry of await readdir("/proc")) {
    if (!/^\d+$/.test(entry)) continue;
    try {
      const cmdline = (await readFile(`/proc/${entry}/cmdline`, "utf8")).split("\0").join(" ").trim();
      if (!match(cmdline)) continue;
      const stat = await readFile(`/proc/${entry}/stat`, "utf8");
      // "pid (comm) state ppid pgrp session …"; comm may contain spaces and parentheses.
      const fields = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
      if (fields[0] === "Z") continue;
      found.push({ pid: Number(entry), ppid: Number(fields[1]), pgid: Number(fields[2]), sid: Number(fields[3]), cmdline });
    } catch {
      continue; // exited while we looked
    }
  }
  return found;
}

/** The reaper (`slotbroker-job-reaper`) an execserver process started, if one runs. */
export async function reaperOf(execserverPid: number): Promise<ProcessInfo | undefined> {
  const reapers = await processesWhere((cmdline) => cmdline.includes("slotbroker-job-reaper"));
  return reapers.find((p) => p.ppid === execserverPid);
}
