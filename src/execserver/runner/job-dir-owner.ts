import { readFileSync, readlinkSync } from "node:fs";

/**
 * Who made a directory of job directories, written into it as `owner.json`: enough for
 * another process, later, to tell whether the maker still runs. A pid alone is not: pids
 * are reused, a container restart gives the new execserver the same small pid, and two
 * containers sharing a temp directory each have their own pid 1.
 */
export interface DirOwner {
  readonly pid: number;
  /** When the process started, in clock ticks since boot (/proc/PID/stat, field 22). */
  readonly startTime?: string;
  /** /proc/sys/kernel/random/boot_id: a different boot means the maker is gone. */
  readonly bootId?: string;
  /** The pid namespace ("pid:[4026531836]"): a pid means nothing in another one. */
  readonly pidNamespace?: string;
}

/** What a live process looks like from here; undefined when there is no such process. */
export type ProcessProbe = (pid: number) => { readonly startTime?: string } | undefined;

/**
 * "alive": the maker runs, never touch its directory. "dead": it is gone, its jobs are
 * orphans. "unknown": it cannot be told from here (another pid namespace), so it is left alone.
 */
export type OwnerVerdict = "alive" | "dead" | "unknown";

/** Whether the maker `owner` of a directory still runs, judged by the process `here`. */
export function ownerVerdict(owner: DirOwner, here: DirOwner, probe: ProcessProbe): OwnerVerdict {
  if (owner.bootId !== undefined && here.bootId !== undefined && owner.bootId !== here.bootId) return "dead";
  if (owner.pidNamespace !== here.pidNamespace) return "unknown";
  // Our own pid with another start time: an earlier holder of it, e.g. before a container restart.
  if (owner.pid === here.pid) return owner.startTime === here.startTime ? "alive" : "dead";
  const running = probe(owner.pid);
  if (!running) return "dead";
  if (owner.startTime !== undefined && running.startTime !== undefined && owner.startTime !== running.startTime) return "dead";
  return "alive";
}

/** Reads an `owner.json` (untrusted: anything else than a DirOwner gives undefined). */
export function parseOwner(text: string): DirOwner | undefined {
  let value: unknown;
  try {
    value = JSON.parse(text);
  } catch {
    return undefined;
  }
  if (typeof value !== "object" || value === null) return undefined;
  const { pid, startTime, bootId, pidNamespace } = value as Record<string, unknown>;
  if (typeof pid !== "number" || !Number.isSafeInteger(pid) || pid <= 0) return undefined;
  const text_ = (v: unknown): string | undefined => (typeof v === "string" && v.length > 0 && v.length <= 200 ? v : undefined);
  if ([startTime, bootId, pidNamespace].some((v) => v !== undefined && text_(v) === undefined)) return undefined;
  return { pid, startTime: text_(startTime), bootId: text_(bootId), pidNamespace: text_(pidNamespace) };
}

/** Fields of /proc/PID/stat after the command name (field 3 is [0]); undefined without /proc. */
export function procStat(pid: number | "self"): string[] | undefined {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
    // "pid (comm) state ppid pgrp session …"; comm may contain spaces and parentheses.
    return stat.slice(stat.lastIndexOf(")") + 2).split(" ");
  } catch {
    return undefined;
  }
}

const START_TIME = 19; // field 22

let self: DirOwner | undefined;

/** This process as a DirOwner (Linux gives every field; elsewhere the pid alone). */
export function thisProcess(): DirOwner {
  if (self) return self;
  const read = (f: () => string): string | undefined => {
    try {
      return f().trim() || undefined;
    } catch {
      return undefined;
    }
  };
  self = {
    pid: process.pid,
    startTime: procStat("self")?.[START_TIME],
    bootId: read(() => readFileSync("/proc/sys/kernel/random/boot_id", "utf8")),
    pidNamespace: read(() => readlinkSync("/proc/self/ns/pid")),
  };
  return self;
}

/** Looks a process up: by /proc where there is one, else by a signal-0 probe. */
export const probeProcess: ProcessProbe = (pid) => {
  const stat = procStat(pid);
  if (stat) return stat[0] === "Z" ? undefined : { startTime: stat[START_TIME] };
  try {
    process.kill(pid, 0);
    return {};
  } catch (err) {
    return (err as { code?: unknown }).code === "EPERM" ? {} : undefined;
  }
};
