import { spawn, type ChildProcess } from "node:child_process";
import { basename, dirname } from "node:path";
import { performance } from "node:perf_hooks";
import type { Writable } from "node:stream";

// One `sh` per execserver process reads lines from a pipe whose only writer is the
// execserver (builtins only: no process per line):
//   ?DIR   a job is about to be forked with working directory DIR (its group id is not
//          known yet); not sent for a job directory in an @DIR, found by the scan below;
//   +PGID  the job's process group, once spawn() returned (the native job launcher, which
//          holds this pipe too, writes it itself right after its spawn);
//   =DIR   DIR is covered by its +PGID (or the spawn failed);
//   -PGID  the job is over;
//   @DIR   the execserver's own directory of job directories: removed at the end.
// Its read returns EOF only when the execserver closed the pipe or died (the kernel closes
// a dead process's descriptors, even after SIGKILL); then it kills every group still in
// the set, and every process whose working directory is a DIR still pending (an execserver
// killed in the middle of a fork never got to write the +PGID) or a job directory in an
// @DIR (what left its job's group, a job whose launcher died before it told its pid).
// Then it removes the @DIRs.
// It runs in a session (and process group) of its own and ignores HUP, INT and TERM, so
// whatever reaches the execserver's group does not reach it: `kill -9 -- -PGID` (a
// shell's or supervisord's group kill), a terminal's hang-up, a Ctrl-C.

/** Names of job directories, inside their execserver's directory (see job-dir.ts). */
export const JOB_DIR_PREFIX = "slotbroker-job-";

const REAPER_SCRIPT = `set -f
trap '' HUP INT TERM
nl='
'
groups=" "
pending=""
dirs=""
while IFS= read -r line; do
  case $line in
    +*) groups="$groups\${line#+} " ;;
    -*) g=\${line#-}; case $groups in *" $g "*) groups="\${groups%% $g *} \${groups#* $g }" ;; esac ;;
    [?]*) pending="$pending\${line#?}$nl" ;;
    =*) d=\${line#=}; rest=""; IFS=$nl; for p in $pending; do [ "$p" = "$d" ] || rest="$rest$p$nl"; done; unset IFS; pending=$rest ;;
    @*) dirs="$dirs\${line#@}$nl" ;;
  esac
done
for g in $groups; do kill -s KILL -- "-$g" 2>/dev/null; done
IFS=$nl
set +f
scan=$pending
for d in $dirs; do for j in "$d"/${JOB_DIR_PREFIX}*; do [ -d "$j" ] && scan="$scan$j$nl"; done; done
for p in $scan; do
  for proc in /proc/[0-9]*; do
    [ "$proc/cwd" -ef "$p" ] || continue
    pid=\${proc#/proc/}
    kill -s KILL -- "-$pid" 2>/dev/null || kill -s KILL "$pid" 2>/dev/null
  done
done
set -f
for d in $dirs; do rm -rf -- "$d" 2>/dev/null || { sleep 1; rm -rf -- "$d" 2>/dev/null; }; done
exit 0`;

type OnError = (err: Error) => void;

/**
 * How long a "-PGID" line may wait for the next write to the reaper. Until then the reaper
 * would, were the execserver to die, also signal the ended job's group: harmless, the group
 * is gone (killed at the job's end), and its id cannot be another group's yet, since the
 * kernel reuses a pid only after it went through every other one.
 */
const ENDED_FLUSH_MS = 20;

/** The reaper of this process, started with the first watched job and restarted if it dies. */
class GroupReaper {
  #child: ChildProcess | undefined;
  // Counts the reapers started: a group registered with an earlier one is told again.
  #generation = 0;
  readonly #watched = new Set<number>();
  readonly #pending = new Set<string>();
  readonly #owned = new Set<string>();
  // Lines held while batching (see batch()); undefined otherwise.
  #held: string | undefined;
  // "-PGID" lines not written yet (see ENDED_FLUSH_MS): one write per job instead of two
  // while jobs follow each other.
  #ended = "";
  #endedTimer: NodeJS.Timeout | undefined;

  /** `watchedBy`: the reaper (see pipe()) that was told of `pgid` already, if any. */
  add(pgid: number, onError: OnError, watchedBy?: number): void {
    const child = this.#ensure(onError);
    this.#watched.add(pgid);
    if (child && watchedBy !== this.#generation) this.#write(child, `+${pgid}\n`);
  }

  /** The reaper's pipe, for a helper process to write "+PGID" lines to, and which reaper it is. */
  pipe(onError: OnError): { readonly stream: Writable; readonly generation: number } | undefined {
    const child = this.#ensure(onError);
    return child && { stream: child.stdin!, generation: this.#generation };
  }

  /**
   * A job is about to be forked in `dir`; see REAPER_SCRIPT. False when nothing needs to be
   * said: `dir` is a job directory in an @DIR, which the reaper scans anyway.
   */
  expect(dir: string, onError: OnError): boolean {
    const child = this.#ensure(onError);
    if (child && this.#owned.has(dirname(dir)) && basename(dir).startsWith(JOB_DIR_PREFIX)) return false;
    if (child) this.#write(child, `?${dir}\n`);
    this.#pending.add(dir);
    return true;
  }

  /** `dir`'s job is registered by its group id, or was never forked. */
  settle(dir: string): void {
    if (!this.#pending.delete(dir) || !this.#child) return;
    this.#write(this.#child, `=${dir}\n`);
  }

  /** `dir` is removed once the execserver is gone (after its jobs were killed). */
  own(dir: string, onError: OnError): void {
    const child = this.#ensure(onError);
    this.#owned.add(dir);
    if (child) this.#write(child, `@${dir}\n`);
  }

  remove(pgid: number): void {
    if (!this.#watched.delete(pgid) || !this.#child) return;
    this.#ended += `-${pgid}\n`;
    if (this.#endedTimer === undefined) this.#endedTimer = setTimeout(this.#flushEnded, ENDED_FLUSH_MS).unref();
  }

  readonly #flushEnded = (): void => {
    this.#endedTimer = undefined;
    if (this.#ended && this.#child) this.#write(this.#child, "");
  };

  /**
   * Runs `fn` (synchronous) and writes the lines it produced in one write at its end: a
   * write to the pipe is a syscall and a wakeup of the reaper, so "+PGID" and "=DIR" of
   * one job go together. Order is kept, and nothing waits past `fn`.
   */
  batch<T>(fn: () => T): T {
    if (this.#held !== undefined) return fn();
    this.#held = "";
    try {
      return fn();
    } finally {
      const lines = this.#held;
      this.#held = undefined;
      if (lines) this.#child?.stdin!.write(lines);
    }
  }

  #write(child: ChildProcess, line: string): void {
    const lines = this.#ended + line;
    this.#ended = "";
    if (this.#held !== undefined && child === this.#child) this.#held += lines;
    else child.stdin!.write(lines);
  }

  #ensure(onError: OnError): ChildProcess | undefined {
    if (this.#child) return this.#child;
    let child: ChildProcess;
    try {
      // detached: a session and process group of its own (see REAPER_SCRIPT).
      child = spawn("/bin/sh", ["-c", REAPER_SCRIPT, "slotbroker-job-reaper"], { stdio: ["pipe", "ignore", "ignore"], detached: true });
    } catch (err) {
      onError(err as Error);
      return undefined;
    }
    const startedAt = performance.now();
    child.on("error", onError);
    child.stdin!.on("error", () => undefined);
    // A reaper that died (killed by hand) is replaced at once while jobs run, told of every
    // group still running; one that died within a second of its start (it would again) at
    // the next job.
    child.once("exit", () => {
      if (this.#child !== child) return;
      this.#child = undefined;
      if (this.#watched.size + this.#pending.size > 0 && performance.now() - startedAt > 1_000) this.#ensure(onError);
    });
    child.unref();
    (child.stdin as unknown as { unref?: () => void }).unref?.();
    this.#child = child;
    this.#generation++;
    // Lines held for a dead reaper are dropped: the new one is told the whole state here.
    if (this.#held !== undefined) this.#held = "";
    this.#ended = "";
    for (const pgid of this.#watched) child.stdin!.write(`+${pgid}\n`);
    for (const dir of this.#pending) child.stdin!.write(`?${dir}\n`);
    for (const dir of this.#owned) child.stdin!.write(`@${dir}\n`);
    return child;
  }
}

const reaper = new GroupReaper();

/**
 * Registers a job's process group with the execserver's reaper, which kills the group when
 * the execserver dies, even by SIGKILL (Node has no parent-death signal). So a job never
 * outlives its execserver by more than the moment the kernel takes to close the dead
 * process's pipes. One reaper serves every job: watching costs a line on a pipe, not a
 * process per job.
 */
export class GroupWatchdog {
  readonly #pgid: number;
  #stopped = false;

  /** `watchedBy`: the reaper that a job launcher told of the group already (see reaperPipe). */
  constructor(pgid: number, onError: OnError, watchedBy?: number) {
    this.#pgid = pgid;
    reaper.add(pgid, onError, watchedBy);
  }

  /** The job is over: stop watching its group (before its id can be reused by another). */
  stop(): void {
    if (this.#stopped) return;
    this.#stopped = true;
    reaper.remove(this.#pgid);
  }
}

/**
 * The write end of this process's reaper (started if none runs) for the native job
 * launcher, which registers each job's group there right after spawning it; `generation`
 * names this reaper for GroupWatchdog's `watchedBy`. Once that reaper is dead its pipe has
 * no reader: the launcher's write fails and the execserver registers the group itself.
 */
export function reaperPipe(onError: OnError): { readonly stream: Writable; readonly generation: number } | undefined {
  return reaper.pipe(onError);
}

/** Runs `fn` with the reaper lines it writes sent in one write; see GroupReaper.batch. */
export function batchReaperLines<T>(fn: () => T): T {
  return reaper.batch(fn);
}

/**
 * Covers the moment between fork and the job's GroupWatchdog: if the execserver dies
 * then, the reaper finds the job by its working directory. Call the returned function once
 * the watchdog exists or the spawn failed. A job directory in this process's own directory
 * (makeJobDir's) costs no line: the reaper scans those anyway. A directory whose name holds
 * a line break cannot go through the reaper's line protocol and is not covered.
 */
export function watchForkIn(dir: string, onError: OnError): () => void {
  if (dir.includes("\n") || !reaper.expect(dir, onError)) return noop;
  return () => reaper.settle(dir);
}

const noop = (): void => undefined;

/**
 * Has the reaper remove `dir` (the execserver's own directory of job directories) once
 * the execserver is gone, however it ends. A name holding a line break is left to the
 * next execserver's sweep (see leftover-jobs.ts).
 */
export function removeWhenGone(dir: string, onError: OnError): void {
  if (!dir.includes("\n")) reaper.own(dir, onError);
}
