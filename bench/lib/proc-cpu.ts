// CPU time of processes from /proc (Linux): what each part of a system spends per item,
// which a loaded machine distorts far less than wall time.
import { readdirSync, readFileSync } from "node:fs";

const ticksPerSecond = 100; // USER_HZ; Linux reports 100 on every common platform

/** User + system ms of `pid`, with its waited-for children (the commands it ran); 0 once gone. */
export function cpuMs(pid: number | undefined): number {
  const { own, children } = cpuParts(pid);
  return own + children;
}

/** User + system ms of `pid` itself and of its waited-for children apart; 0 once gone. */
export function cpuParts(pid: number | undefined): { own: number; children: number } {
  if (pid === undefined) return { own: 0, children: 0 };
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
    // Fields after "(comm)": state ppid … utime(14) stime(15) cutime(16) cstime(17).
    const f = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
    const ms = (ticks: number): number => (ticks * 1000) / ticksPerSecond;
    return { own: ms(Number(f[11]) + Number(f[12])), children: ms(Number(f[13]) + Number(f[14])) };
  } catch {
    return { own: 0, children: 0 };
  }
}

/**
 * `pids` and their live child processes (the execserver's job launcher and reaper): a
 * helper process's CPU, and that of the jobs it waited for, belong to its parent's share.
 */
export function withLiveChildren(pids: readonly number[]): number[] {
  const out = [...pids];
  for (const pid of pids) {
    try {
      const children = readFileSync(`/proc/${pid}/task/${pid}/children`, "utf8").trim();
      if (children) out.push(...children.split(" ").map(Number));
    } catch {
      // gone, or a kernel without the children file: the parent alone
    }
  }
  return out;
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

/**
 * CPU ms of named groups of processes between start() and stop(). Each group's figure
 * includes the commands its processes ran (waited-for children); `NAME(children)` gives
 * that share apart when it is not zero.
 */
export class CpuMeter {
  private readonly before = new Map<string, Map<number, { own: number; children: number }>>();

  constructor(private readonly groups: Record<string, () => number[]>) {}

  start(): void {
    for (const [name, pids] of Object.entries(this.groups)) this.before.set(name, new Map(pids().map((p) => [p, cpuParts(p)])));
  }

  /** Ms spent per group since start() (processes that appeared meanwhile count from 0). */
  stop(): Record<string, number> {
    const out: Record<string, number> = {};
    for (const [name, pids] of Object.entries(this.groups)) {
      const before = this.before.get(name) ?? new Map<number, { own: number; children: number }>();
      let own = 0;
      let children = 0;
      for (const p of pids()) {
        const now = cpuParts(p);
        const then = before.get(p) ?? { own: 0, children: 0 };
        own += Math.max(0, now.own - then.own);
        children += Math.max(0, now.children - then.children);
      }
      out[name] = own + children;
      if (children > 0) out[`${name}(children)`] = children;
    }
    return out;
  }
}
