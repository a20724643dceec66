// CPU time of processes from /proc (Linux): what each part of a system spends per item,
// which a loaded machine distorts far less than wall time.
import { readdirSync, readFileSync } from "node:fs";

const ticksPerSecond = 100; // USER_HZ; Linux reports 100 on every common platform

/** User + system ms of `pid`, with its waited-for children (the commands it ran); 0 once gone. */
export function cpuMs(pid: number | undefined): number {
  if (pid === undefined) return 0;
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
    // Fields after "(comm)": state ppid … utime(14) stime(15) cutime(16) cstime(17).
    const f = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
    return ((Number(f[11]) + Number(f[12]) + Number(f[13]) + Number(f[14])) * 1000) / ticksPerSecond;
  } catch {
    return 0;
  }
}

/** Pids of the Postgres backends serving database `name` (their title names it). */
export function postgresBackends(name: string): number[] {
  const pids: number[] = [];
  for (const entry of readdirSync("/proc")) {
    if (!/^\d+$/.test(entry)) continue;
    try {
      const title = readFileSync(`/proc/${entry}/cmdline`, "utf8");
      if (title.startsWith("postgres: ") && title.includes(` ${name} `)) pids.push(Number(entry));
    } catch {
      // gone meanwhile
    }
  }
  return pids;
}

/** CPU ms of named groups of processes between start() and stop(). */
export class CpuMeter {
  private readonly before = new Map<string, Map<number, number>>();

  constructor(private readonly groups: Record<string, () => number[]>) {}

  start(): void {
    for (const [name, pids] of Object.entries(this.groups)) this.before.set(name, new Map(pids().map((p) => [p, cpuMs(p)])));
  }

  /** Ms spent per group since start() (processes that appeared meanwhile count from 0). */
  stop(): Record<string, number> {
    const out: Record<string, number> = {};
    for (const [name, pids] of Object.entries(this.groups)) {
      const before = this.before.get(name) ?? new Map<number, number>();
      out[name] = pids().reduce((sum, p) => sum + Math.max(0, cpuMs(p) - (before.get(p) ?? 0)), 0);
    }
    return out;
  }
}
