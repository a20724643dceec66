// What /proc and `ss` say about a process and its sockets, for memory and CPU figures that
// include what the V8 heap does not show.
import { execFileSync } from "node:child_process";
import { readFileSync } from "node:fs";

/** Resident set size (VmRSS) of `pid`, in bytes. */
export function rssBytes(pid: number): number {
  const kib = /VmRSS:\s+(\d+) kB/.exec(readFileSync(`/proc/${pid}/status`, "utf8"))?.[1];
  if (kib === undefined) throw new Error(`no VmRSS for pid ${pid}`);
  return Number(kib) * 1024;
}

/** User + system CPU time of `pid` so far, in milliseconds. */
export function processCpuMs(pid: number): number {
  const { user, system } = processCpuSplitMs(pid);
  return user + system;
}

/** User and system (kernel: syscalls, loopback TCP) CPU time of `pid` so far, in milliseconds. */
export function processCpuSplitMs(pid: number): { user: number; system: number } {
  const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
  const fields = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
  // Fields 14 and 15 of stat (utime, stime), counted from "state" as field 3.
  return { user: (Number(fields[11]) * 1000) / clockTicks, system: (Number(fields[12]) * 1000) / clockTicks };
}

// USER_HZ; 100 on every Linux this runs on, asked once in case it is not.
const clockTicks = (() => {
  try {
    return Number(execFileSync("getconf", ["CLK_TCK"], { encoding: "utf8" }).trim()) || 100;
  } catch {
    return 100;
  }
})();

/**
 * Kernel memory charged to the established TCP sockets on local port `port` (the server's
 * side), from `ss -tm`: receive queue + forward-alloc + queued send data + option memory
 * of every socket (skmem r, f, w, o), in bytes.
 */
export function kernelSocketBytes(port: number): number {
  const out = execFileSync("ss", ["-tmnH", "state", "established", `( sport = :${port} )`], { encoding: "utf8", maxBuffer: 256 * 1024 * 1024 });
  let total = 0;
  for (const m of out.matchAll(/skmem:\(([^)]*)\)/g)) {
    const fields = Object.fromEntries(m[1]!.split(",").map((f) => [f.replace(/\d+$/, ""), Number(/\d+$/.exec(f)?.[0] ?? 0)]));
    total += (fields.r ?? 0) + (fields.f ?? 0) + (fields.w ?? 0) + (fields.o ?? 0);
  }
  return total;
}

/** The kernel's slab memory (machine-wide, /proc/meminfo Slab), in bytes: socket structures live there. */
export function slabBytes(): number {
  const kib = /^Slab:\s+(\d+) kB/m.exec(readFileSync("/proc/meminfo", "utf8"))?.[1];
  return Number(kib ?? 0) * 1024;
}
