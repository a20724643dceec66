// What the soak runs: one shell script as the only service, and a seeded mix of items.
// Every execution appends to a side ledger (small O_APPEND writes, atomic on Linux), so
// the checker counts executions from the jobs themselves, not from what the system says.
import { chmodSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { prng } from "../../harness/prng.js";

export { prng };

/** How an item's job behaves. */
export type JobMode = "short" | "long" | "large" | "fail" | "largefail" | "timeout";

/** One item the soak submits. `tag` is its idempotency key and its name in the ledger. */
export interface SoakItem {
  readonly tag: string;
  readonly mode: JobMode;
  readonly param: string;
  /** The job timeout given with the call (timeout mode only). */
  readonly timeout?: string;
  readonly maxAttempts: number;
}

/** Modes whose every attempt fails by design (each attempt is an expected execution). */
export const failingModes: ReadonlySet<JobMode> = new Set(["fail", "largefail", "timeout"]);

// $1 ledger, $2 tag, $3 mode, $4 param. "start"/"end" lines carry the shell's pid and the
// execserver's that started it (its parent, or the job launcher's parent when the launcher
// forked it), so the checker can tell a job that outlived its execserver. A job stopped by SIGTERM (timeout, cancel) ends with code 143; one
// killed by SIGKILL writes no end line (the soak's exit watcher and the execserver's log
// tell when and how it ended).
const script = `#!/bin/sh
ledger=$1; tag=$2; mode=$3; param=$4
now() { date +%s%3N; }
exec_pid=$PPID
comm=; read -r comm < /proc/$PPID/comm 2>/dev/null
case "$comm" in slotbroker-job*)
  while read -r key value; do [ "$key" = PPid: ] && exec_pid=$value && break; done < /proc/$PPID/status ;;
esac
trap 'echo "end $tag $$ $exec_pid $(now) 143" >> "$ledger"; exit 143' TERM
echo "start $tag $$ $exec_pid $(now)" >> "$ledger"
code=0
case "$mode" in
  short|long|timeout) sleep "$param" ;;
  large) head -c "$param" /dev/zero ;;
  fail) echo "failing on purpose" >&2; code=3 ;;
  largefail) head -c "$param" /dev/zero; sleep 1; code=3 ;;
esac
echo "end $tag $$ $exec_pid $(now) $code" >> "$ledger"
exit $code
`;

/** Writes the job script into `dir`; returns its path. */
export function writeJobScript(dir: string): string {
  const path = join(dir, "soak-job.sh");
  writeFileSync(path, script);
  chmodSync(path, 0o755);
  return path;
}

/** The n-th item of a run: mostly short, some long, large, failing and timing out. */
export function makeItem(run: string, n: number, rand: () => number): SoakItem {
  const tag = `${run}-${String(n).padStart(6, "0")}`;
  const r = rand();
  if (r < 0.55) return { tag, mode: "short", param: (0.05 + rand() * 0.3).toFixed(2), maxAttempts: 8 };
  if (r < 0.65) return { tag, mode: "long", param: (2 + rand() * 4).toFixed(1), maxAttempts: 8 };
  if (r < 0.83) return { tag, mode: "large", param: String(rand() < 0.8 ? 20_000 : 300_000), maxAttempts: 8 };
  if (r < 0.91) return { tag, mode: "fail", param: "0", maxAttempts: 2 };
  if (r < 0.96) return { tag, mode: "largefail", param: "200000", maxAttempts: 2 };
  return { tag, mode: "timeout", param: "30", timeout: "1s", maxAttempts: 2 };
}

/** The QueueService Submit body for an item. */
export function submitBody(item: SoakItem, ledger: string): object {
  return {
    calls: [{ service: "soak", args: [ledger, item.tag, item.mode, item.param], ...(item.timeout ? { timeout: item.timeout } : {}) }],
    idempotencyKey: item.tag,
    maxAttempts: item.maxAttempts,
  };
}
