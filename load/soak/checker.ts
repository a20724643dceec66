// The soak's invariant check, pure: from what was submitted, the database's final rows, the
// completions a trigger recorded, the jobs' own ledger and the faults the driver injected,
// it says what happened to every item and which invariant broke.
import { failingModes, type SoakItem } from "./jobs.js";
import type { FaultEvent } from "./driver.js";

/** One execution as the job wrote it to the ledger. */
export interface Execution {
  readonly tag: string;
  readonly pid: number;
  /** The execserver that spawned the job (the shell's parent). */
  readonly execPid: number;
  readonly start: number;
  end?: number;
  code?: number;
}

/** How the execserver said a job ended (its log's "job failed" line, by the job's pid). */
export interface ExecOutcome {
  readonly at: number;
  readonly signal?: string;
  readonly error?: string;
  readonly message?: string;
}

/** An item's row at the end of the run. */
export interface FinalRow {
  readonly tag: string;
  readonly state: string;
  readonly attempts: number;
  readonly error: string | null;
}

export interface CheckInput {
  readonly items: readonly SoakItem[];
  readonly rows: readonly FinalRow[];
  /** tag → how many times the item moved into a final state (the trigger's table). */
  readonly completions: ReadonlyMap<string, number>;
  readonly ledger: string;
  readonly faults: readonly FaultEvent[];
  /** Execserver pid → when it died. */
  readonly execDeaths: ReadonlyMap<number, number>;
  /** Execserver pid → its name and the chaos proxy its broker streams go through. */
  readonly execPaths: ReadonlyMap<number, { readonly name: string; readonly proxy: string }>;
  /** "TAG PID" → when the exit watcher saw the job's process gone. */
  readonly gone: ReadonlyMap<string, number>;
  /** Job pid → the execserver's outcome lines for that pid (pids are reused: match by time). */
  readonly outcomes: ReadonlyMap<number, readonly ExecOutcome[]>;
  /** Crashes the soak did not cause: "name pid how". */
  readonly crashes: readonly string[];
  /** Leftovers found at the end: slots, wants, job processes. */
  readonly leftovers: readonly string[];
  /** Job directories found at the end in the execservers' temp directory (none runs a job then). */
  readonly leftoverJobDirs: readonly string[];
}

export interface CheckResult {
  readonly report: string[];
  readonly violations: string[];
}

/** Parses the ledger's "start TAG PID PPID MS" and "end TAG PID PPID MS CODE" lines. */
export function parseLedger(text: string): Map<string, Execution[]> {
  const byPid = new Map<number, Execution>();
  const byTag = new Map<string, Execution[]>();
  for (const line of text.split("\n")) {
    const f = line.trim().split(" ");
    if (f[0] === "start" && f.length === 5) {
      const e: Execution = { tag: f[1]!, pid: Number(f[2]), execPid: Number(f[3]), start: Number(f[4]) };
      byPid.set(e.pid, e);
      const list = byTag.get(e.tag) ?? [];
      list.push(e);
      byTag.set(e.tag, list);
    } else if (f[0] === "end" && f.length === 6) {
      const e = byPid.get(Number(f[2]));
      if (e && e.tag === f[1]) {
        e.end = Number(f[4]);
        e.code = Number(f[5]);
      }
    }
  }
  for (const list of byTag.values()) list.sort((a, b) => a.start - b.start);
  return byTag;
}

const fylrFaults = new Set(["kill-fylr", "stop-fylr", "restart-postgres", "crash-fylr"]);

/** Checks every invariant; `violations` empty means the run passed. */
export function check(input: CheckInput): CheckResult {
  // Crashes and leftovers first: they are the most telling, and the list is cut when printed.
  const violations: string[] = [
    ...input.crashes.map((c) => `a process crashed on its own: ${c}`),
    ...input.leftovers.map((l) => `left over: ${l}`),
    ...input.leftoverJobDirs.map((d) => `left over: job directory ${d}`),
  ];
  const runs = parseLedger(input.ledger);
  const rows = new Map(input.rows.map((r) => [r.tag, r]));
  const explained: Record<string, number> = {};
  const states: Record<string, number> = {};
  const histogram: Record<number, number> = {};
  const chaosFailures: Record<string, number> = {};
  let executions = 0;
  let maxRecoveryMs = 0;
  let maxRecoveryTag = "";
  const explain = (why: string): void => void (explained[why] = (explained[why] ?? 0) + 1);
  const faultBetween = (from: number, to: number, hit: (f: FaultEvent) => boolean): FaultEvent | undefined =>
    input.faults.find((f) => f.at <= to && f.until >= from - 1000 && hit(f));
  // Which fylr held a run is not known, so any fylr (or Postgres) fault may have hit it; an
  // execserver or broker-path fault only when it hit that run's execserver or proxy.
  const hitRun = (e: Execution) => {
    const path = input.execPaths.get(e.execPid);
    return (f: FaultEvent): boolean =>
      fylrFaults.has(f.kind) ||
      (f.pid !== undefined && f.pid === e.execPid) ||
      (f.kind === "crash-execserver" && f.target === path?.name) ||
      (f.kind.endsWith("-broker") && f.target.split(" ")[0] === path?.proxy);
  };

  for (const item of input.items) {
    const row = rows.get(item.tag);
    const list = runs.get(item.tag) ?? [];
    executions += list.length;
    histogram[list.length] = (histogram[list.length] ?? 0) + 1;
    if (!row) {
      violations.push(`${item.tag}: lost (accepted, but no row in the database)`);
      continue;
    }
    states[row.state] = (states[row.state] ?? 0) + 1;
    if (row.state !== "succeeded" && row.state !== "failed") violations.push(`${item.tag}: not final (${row.state}, ${row.attempts} attempts)`);
    const done = input.completions.get(item.tag) ?? 0;
    if (done > 1) violations.push(`${item.tag}: completion accepted ${done} times`);
    if ((row.state === "succeeded" || row.state === "failed") && done === 0) violations.push(`${item.tag}: final without a recorded completion`);
    const failing = failingModes.has(item.mode);
    if (failing && row.state === "succeeded") violations.push(`${item.tag}: a ${item.mode} job succeeded`);
    if (!failing && row.state === "failed") {
      const reason = (row.error ?? "").replace(/[0-9a-f-]{8,}/g, "…").slice(0, 90);
      chaosFailures[reason] = (chaosFailures[reason] ?? 0) + 1;
    }
    if (!failing && row.state === "succeeded" && !list.some((e) => e.code === 0)) violations.push(`${item.tag}: succeeded, but no execution finished`);
    if (list.length > row.attempts) violations.push(`${item.tag}: ${list.length} executions but only ${row.attempts} claims (attempts)`);

    const ends = list.map((e) => ending(e, input));
    for (const [k, e] of list.entries()) {
      const died = input.execDeaths.get(e.execPid);
      const end = e.end ?? input.gone.get(`${e.tag} ${e.pid}`);
      const slack = e.end !== undefined ? 200 : WATCH_SLACK_MS;
      if (died !== undefined && end !== undefined && end > died + slack) {
        violations.push(`${item.tag}: job pid ${e.pid} outlived its execserver (pid ${e.execPid} died, the job ended ${end - died} ms later)`);
      }
      const how = ends[k]!.how;
      if (how === "killed, no record") violations.push(`${item.tag}: job pid ${e.pid} ended without its end line while its execserver (pid ${e.execPid}) lived, and the execserver logged no SIGKILL of it`);
      if (how === "still running") violations.push(`${item.tag}: job pid ${e.pid} never ended (no end line, never seen gone)`);
    }
    for (let k = 1; k < list.length; k++) {
      const prev = list[k - 1]!;
      const next = list[k]!;
      const prevEnd = ends[k - 1]!;
      const interrupted = prev.end === undefined;
      if (interrupted || prev.code === 0) {
        const since = prev.end ?? prev.start;
        if (next.start - since > maxRecoveryMs) {
          maxRecoveryMs = next.start - since;
          maxRecoveryTag = item.tag;
        }
      }
      // A failed attempt is retried by design.
      if (failing && prev.end !== undefined && prev.code !== 0) {
        explain("retry after a failed attempt");
        continue;
      }
      if (failing && interrupted && item.mode === "timeout") {
        explain("retry after a timeout");
        continue;
      }
      const overlap = (prevEnd.at ?? Infinity) > next.start;
      const ended = prevEnd.how === "own end line" ? `its end line (code ${prev.code})` : prevEnd.how;
      if (overlap) {
        const fylrFault = faultBetween(prev.start, next.start, (f) => fylrFaults.has(f.kind));
        if (fylrFault) {
          explain(`overlapping run: its fylr was declared dead (${fylrFault.kind}); the fence refused the old completion`);
          continue;
        }
        const freeze = freezeExplaining(prev, prevEnd.at, next.start, input);
        if (freeze) {
          explain(`overlapping run: ${freeze.kind} made its fylr give up on the stream; the job ran on until the thaw`);
          continue;
        }
        const runOn = prevEnd.at === undefined ? "never ended" : `ended ${prevEnd.at - next.start} ms later by ${ended}`;
        violations.push(`${item.tag}: execution ${k + 1} (pid ${next.pid}) started ${next.start - prev.start} ms after execution ${k} (pid ${prev.pid} on execserver pid ${prev.execPid}), which was still running (it ${runOn}); no fault explains the overlap`);
        continue;
      }
      const fault = faultBetween(prev.start, next.start, hitRun(prev));
      if (!fault) {
        violations.push(`${item.tag}: execution ${k + 1} (pid ${next.pid}) started ${next.start - prev.start} ms after execution ${k} (pid ${prev.pid} on execserver pid ${prev.execPid}) ended (${ended}) with no fault of its fylr, execserver or broker path to explain it`);
        continue;
      }
      if (prevEnd.how === "killed with its execserver") {
        const name = input.execPaths.get(prev.execPid)?.name;
        const kill = input.faults.find((f) => (f.kind === "kill-execserver" && f.pid === prev.execPid) || (f.kind === "crash-execserver" && f.target === name));
        if (kill) explain(`rescued after ${kill.kind}: the job died with its execserver`);
        else violations.push(`${item.tag}: execution ${k} (pid ${prev.pid}) died with its execserver (pid ${prev.execPid}), which no fault killed`);
      } else if (prevEnd.how === "killed by its execserver") explain(`rescued after ${fault.kind}: its execserver SIGKILLed the job (${prevEnd.outcome?.error ?? "?"})`);
      else explain(`rescued after ${fault.kind}`);
    }
  }


  const faults: Record<string, number> = {};
  for (const f of input.faults) faults[f.kind] = (faults[f.kind] ?? 0) + 1;
  const fmt = (o: Record<string | number, number>): string =>
    Object.entries(o)
      .map(([k, v]) => `${k}=${v}`)
      .join(", ") || "none";
  const report = [
    `items submitted and accepted: ${input.items.length}`,
    `final states: ${fmt(states)}`,
    `lost: ${input.items.filter((i) => !rows.has(i.tag)).length}`,
    `completions accepted twice: ${[...input.completions.values()].filter((n) => n > 1).length}`,
    `executions (ledger): ${executions}; items by executions: ${fmt(histogram)}`,
    `extra executions explained: ${fmt(explained)}`,
    `items meant to succeed that failed under chaos: ${fmt(chaosFailures)}`,
    `faults injected: ${fmt(faults)}`,
    `crashes not caused by the soak: ${input.crashes.length}`,
    `leftovers (slots, wants, job processes): ${input.leftovers.length}`,
    `leftover job directories: ${input.leftoverJobDirs.length}`,
    `longest wait for recovery: ${maxRecoveryMs} ms${maxRecoveryTag ? ` (${maxRecoveryTag})` : ""}`,
    `violations: ${violations.length}`,
  ];
  return { report, violations };
}

/** After a frozen execserver or broker path thaws, the execserver sees the stream gone and stops the job: SIGTERM, SIGKILL after cancelGrace (2 s). */
const THAW_STOP_MS = 5_000;
/** How late the exit watcher (polling every 100 ms) may see a job its execserver's reaper killed. */
const WATCH_SLACK_MS = 1_000;

/** When and how an execution ended, from its end line, its execserver's death, or the exit watcher. */
export interface Ending {
  /** undefined: still running when the soak ended. */
  readonly at: number | undefined;
  readonly how: "own end line" | "killed with its execserver" | "killed by its execserver" | "killed, no record" | "still running";
  readonly outcome?: ExecOutcome;
}

export function ending(e: Execution, input: Pick<CheckInput, "execDeaths" | "gone" | "outcomes">): Ending {
  if (e.end !== undefined) return { at: e.end, how: "own end line" };
  const gone = input.gone.get(`${e.tag} ${e.pid}`);
  const died = input.execDeaths.get(e.execPid);
  if (died !== undefined && (gone === undefined || gone >= died - WATCH_SLACK_MS)) return { at: Math.min(died, gone ?? died), how: "killed with its execserver" };
  if (gone === undefined) return { at: undefined, how: "still running" };
  const outcome = (input.outcomes.get(e.pid) ?? []).find((o) => o.at >= e.start && o.at <= gone + WATCH_SLACK_MS);
  return outcome?.signal === "SIGKILL" ? { at: gone, how: "killed by its execserver", outcome } : { at: gone, how: "killed, no record" };
}

/**
 * A freeze that explains two overlapping runs: the first run's execserver (SIGSTOP) or its
 * broker path (a frozen proxy) stopped answering, so its fylr gave up on the stream after
 * the ping timeout and ran the item elsewhere, while the job itself kept running. The
 * execserver stops it once it thaws and sees the stream gone, so the first run must have
 * ended by then (THAW_STOP_MS after the thaw).
 */
export function freezeExplaining(prev: Execution, prevEnd: number | undefined, nextStart: number, input: Pick<CheckInput, "faults" | "execPaths">): FaultEvent | undefined {
  const path = input.execPaths.get(prev.execPid);
  if (!path || prevEnd === undefined) return undefined;
  return input.faults.find(
    (f) =>
      ((f.kind === "stop-execserver" && f.pid === prev.execPid) || (f.kind === "freeze-broker" && f.target === path.proxy)) &&
      f.at <= nextStart &&
      f.until >= prev.start &&
      prevEnd <= f.until + THAW_STOP_MS,
  );
}
