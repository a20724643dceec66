// What a benchmark run records about where and how it ran: the commit (and whether the tree
// differed from it), the machine, and the command as typed, so a kept result file says what
// produced it without anyone writing it down.
import { execFileSync } from "node:child_process";
import { arch, cpus, loadavg, platform, release, totalmem } from "node:os";

/** The git commit of `dir`, and whether tracked files differ from it. */
export function gitState(dir: string): { commit: string; dirty: boolean } {
  try {
    const commit = execFileSync("git", ["rev-parse", "HEAD"], { cwd: dir, encoding: "utf8", stdio: ["ignore", "pipe", "ignore"] }).trim();
    // Untracked files do not count: a kept run not yet committed must not mark the next one dirty.
    const status = execFileSync("git", ["status", "--porcelain", "--untracked-files=no"], { cwd: dir, encoding: "utf8", stdio: ["ignore", "pipe", "ignore"] });
    return { commit, dirty: status.trim() !== "" };
  } catch {
    return { commit: "unknown", dirty: false };
  }
}

/** The 1, 5 and 15 minute load averages, two decimals. */
export function loadAverage(): [number, number, number] {
  const [a = 0, b = 0, c = 0] = loadavg().map((x) => Math.round(x * 100) / 100);
  return [a, b, c];
}

/** The machine, as far as it shapes the figures (no host name). */
export function machine(loadAtStart: [number, number, number]): {
  cpus: number;
  model: string;
  memory_bytes: number;
  platform: string;
  arch: string;
  kernel: string;
  load_average: { start: [number, number, number]; end: [number, number, number] };
} {
  const list = cpus();
  return {
    cpus: list.length,
    model: list[0]?.model.trim() ?? "unknown",
    memory_bytes: totalmem(),
    platform: platform(),
    arch: arch(),
    kernel: release(),
    load_average: { start: loadAtStart, end: loadAverage() },
  };
}

// Environment variables the benchmarks read (their sizes, runtimes, profiling flags). A run's
// command lists those that were set, so it can be repeated as it ran.
const benchEnv = /^(BENCH_|E2E_|CONNECTIONS_|CLAIMS_|CLAIM_FAIRNESS_|JOB_START_|LARGE_BENCH_|MEMORY_|PIPE_BENCH_|QUEUE_SIZE|WAKEUP_)|^(RUNNING_MARK_DELAY|SUBMIT_ONLY|SLOTBROKER_LOG_LEVEL)$/;

/**
 * The command that started this run, as typed: `npm run bench -- …` when npm ran it, with
 * the benchmark environment variables that were set in front. `DATABASE_URL` is shown as
 * set, never with its value (it may hold a password).
 */
export function commandLine(args: readonly string[], env: NodeJS.ProcessEnv): string {
  const vars = Object.keys(env)
    .filter((name) => benchEnv.test(name) && env[name] !== undefined)
    .sort()
    .map((name) => `${name}=${shellQuote(env[name]!)}`);
  if (env.DATABASE_URL) vars.push("DATABASE_URL=…");
  const quoted = args.map(shellQuote);
  const command = env.npm_lifecycle_event === "bench" ? ["npm run bench", ...(quoted.length > 0 ? ["--", ...quoted] : [])] : ["tsx bench/run.ts", ...quoted];
  return [...vars, ...command].join(" ");
}

/** `word` as a POSIX shell word: as it is when that is safe, else single-quoted. */
export function shellQuote(word: string): string {
  return /^[A-Za-z0-9_@%+=:,./-]+$/.test(word) ? word : `'${word.replaceAll("'", `'\\''`)}'`;
}
