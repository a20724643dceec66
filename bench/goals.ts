// The goal of every benchmark (bench/README.md explains each one and why its goal is what it
// is). docs/performance.md says of each kept figure whether it meets its goal, and the
// README's "performance at a glance" shows each benchmark's headline figure. A benchmark
// with no goal reports only; a new *.bench.ts needs an entry here (a test checks it).

/** How a figure is compared with its goal. */
export type GoalOp = "<=" | "<" | ">=" | "==";

/** One goal: `figure[on] op target`. */
export interface Goal {
  /** The figure's `metric`. */
  readonly metric: string;
  /** `ratio` (value ÷ the same run's baseline) or the `value` itself. */
  readonly on: "ratio" | "value";
  readonly op: GoalOp;
  readonly target: number;
  /** The value's unit, shown with a `value` goal. */
  readonly unit?: string;
}

/** A benchmark's one-line summary, its goals and the figure the README shows. */
export interface BenchGoals {
  readonly summary: string;
  readonly goals: readonly Goal[];
  /** The metric of the README's at-a-glance row; at most ten benchmarks have one. */
  readonly headline?: string;
}

const ratio = (metric: string, op: GoalOp, target: number): Goal => ({ metric, on: "ratio", op, target });
const value = (metric: string, op: GoalOp, target: number, unit?: string): Goal => ({ metric, on: "value", op, target, unit });

/** Every benchmark of bench/*.bench.ts, in the order bench/README.md lists them. */
export const benchGoals: Readonly<Record<string, BenchGoals>> = {
  "wantbook-scale": {
    summary: "a grant and an UNWANT with 10⁶ parked wants against 10², without and with fairness keys; want-book bytes per want",
    goals: [
      ratio("grant_ns_at_1000000", "<=", 2),
      ratio("unwant_ns_at_1000000", "<=", 2),
      ratio("keyed_grant_ns_at_1000000", "<=", 2),
      ratio("keyed_unwant_ns_at_1000000", "<=", 2),
      ratio("book_bytes_per_want", "<=", 1),
    ],
    headline: "grant_ns_at_1000000",
  },
  fairness: {
    summary: "grants per connection (100 connections parking 1…100 wants); priority inversions",
    goals: [value("jain_index", ">=", 0.99), value("priority_inversions", "==", 0)],
    headline: "jain_index",
  },
  "grant-latency": {
    summary: "WANT → OFFER on an idle slot against a raw grpc-js round trip",
    goals: [ratio("p50_us", "<=", 1.5), ratio("p99_us", "<=", 1.8)],
    headline: "p50_us",
  },
  "job-start": {
    summary: "JOB → DONE and CPU per job with the job launcher against the execserver forking itself",
    goals: [ratio("job_done_p50_us", "<", 1), ratio("exec_own_cpu_ms_per_job", "<", 1), ratio("exec_cpu_ms_per_job", "<", 1)],
  },
  turnaround: {
    summary: "DONE of one job → OFFER to the next parked want, against a raw round trip",
    goals: [ratio("p99_us", "<=", 2)],
  },
  "cycle-throughput": {
    summary: "WANT → OFFER → JOB → DONE cycles/s over 50 connections against raw round trips ÷ 2",
    goals: [ratio("cycles_per_s", ">=", 0.6)],
    headline: "cycles_per_s",
  },
  "pipe-throughput": {
    summary: "1 GiB through stdin pipe → cat → stdout pipe against a raw node:http relay",
    goals: [ratio("MB_per_s", ">=", 0.6)],
    headline: "MB_per_s",
  },
  claims: {
    summary: "claim + complete of no-op items/s against graphile-worker and pg-boss",
    goals: [ratio("items_per_s_vs_faster", ">=", 1)],
    headline: "items_per_s_vs_faster",
  },
  "queue-size": {
    summary: "claim + complete with 10⁶ finished and 10⁵ queued rows in the table, against an empty table",
    goals: [ratio("items_per_s_vs_empty", ">=", 0.9), ratio("claim_p99_vs_empty", "<=", 1.5)],
  },
  "fairness-keys": {
    summary: "a tenant's single items behind another tenant's backlog of 10,000, keys in turn; shares across keys; claim rate with one key",
    goals: [
      ratio("minority_start_p99_ms", "<=", 3),
      value("keys_jain", ">=", 0.99),
      value("weighted_share_error", "<=", 0.05),
      ratio("claim_rate_one_key", ">=", 0.9),
    ],
  },
  "claim-fairness": {
    summary: "5 fylrs on one 40-slot execserver: claims per fylr with the claim share against greedy claiming",
    goals: [value("max_min_claims", "<=", 1.2), value("max_held_per_fylr", "<=", 10)],
    headline: "max_min_claims",
  },
  "large-item": {
    summary: "1 GiB in → cat → 1 GiB out through the whole queue path; peak RSS of each process",
    goals: [value("peak_rss_mb fylr", "<=", 200, "MB"), value("peak_rss_mb execserver", "<=", 200, "MB"), value("peak_rss_mb submit CLI", "<=", 200, "MB")],
  },
  memory: {
    summary: "server heap per broker connection and per parked want against budgets",
    goals: [ratio("bytes_per_connection", "<=", 1), ratio("bytes_per_parked_want", "<=", 1)],
  },
  "idle-and-gap": {
    summary: "requests while idle and the slot idle gap, broker against token polling",
    goals: [value("idle_requests_per_s", "==", 0), ratio("gap_p50_ms", "<=", 0.01), value("gap_p50_ms", "<=", 1, "ms"), ratio("gap_p99_ms", "<=", 0.01)],
    headline: "gap_p50_ms",
  },
  cancel: {
    summary: "cancel of a running job until its process group is gone, against a local SIGTERM",
    goals: [],
  },
  wakeup: {
    summary: "submit on fylr A → claim on fylr B by LISTEN/NOTIFY, against the poll alone",
    goals: [ratio("p50_ms", "<=", 0.05), ratio("p99_ms", "<=", 0.05)],
    headline: "p50_ms",
  },
  connections: {
    summary: "10,000 broker streams and 10⁶ parked wants on one execserver: grant latency, memory, HELLOs, mass disconnect",
    goals: [ratio("grant_p99_us", "<=", 2), ratio("grant_parked_p99_us", "<=", 2), ratio("bytes_per_connection", "<=", 1), ratio("mass_disconnect_ms", "<=", 1)],
  },
  "end-to-end": {
    summary: "an item's whole trip (two fylrs, two execservers, Postgres) against graphile-worker and the two-process floor; traced against untraced",
    goals: [
      ratio("items_per_s", ">=", 1),
      ratio("sha256_items_per_s", ">=", 1),
      ratio("latency_p50_ms", "<", 1),
      ratio("sha256_latency_p50_ms", "<", 1),
      ratio("items_per_s_traced", ">=", 0.9),
    ],
    headline: "items_per_s",
  },
};

/** True when `figure` meets `goal`. */
export function meets(goal: Goal, figure: { readonly value: number; readonly ratio: number }): boolean {
  const x = figure[goal.on];
  switch (goal.op) {
    case "<=":
      return x <= goal.target;
    case "<":
      return x < goal.target;
    case ">=":
      return x >= goal.target;
    case "==":
      return x === goal.target;
  }
}

const opText: Record<GoalOp, string> = { "<=": "≤", "<": "<", ">=": "≥", "==": "=" };

/** A goal as the docs write it: `ratio ≤ 1.5`, `value ≤ 200 MB`. */
export function goalText(goal: Goal): string {
  return `${goal.on} ${opText[goal.op]} ${goal.target}${goal.unit ? ` ${goal.unit}` : ""}`;
}
