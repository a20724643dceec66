import { spawn, type ChildProcess } from "node:child_process";

// One `sh` per execserver process reads "+PGID" / "-PGID" lines from a pipe whose only
// writer is the execserver, keeping the set of running jobs' process groups (builtins only:
// no process per line). Its read returns EOF only when the execserver closed the pipe or
// died (the kernel closes a dead process's descriptors, even after SIGKILL); then it kills
// every group still in the set.
const REAPER_SCRIPT = `set -f
groups=" "
while read -r line; do
  case $line in
    +*) groups="$groups\${line#+} " ;;
    -*) g=\${line#-}; case $groups in *" $g "*) groups="\${groups%% $g *} \${groups#* $g }" ;; esac ;;
  esac
done
for g in $groups; do kill -s KILL -- "-$g" 2>/dev/null; done`;

type OnError = (err: Error) => void;

/** The reaper of this process, started with the first watched job and restarted if it dies. */
class GroupReaper {
  #child: ChildProcess | undefined;
  readonly #watched = new Set<number>();

  add(pgid: number, onError: OnError): void {
    const child = this.#ensure(onError);
    this.#watched.add(pgid);
    child?.stdin!.write(`+${pgid}\n`);
  }

  remove(pgid: number): void {
    if (!this.#watched.delete(pgid)) return;
    this.#child?.stdin!.write(`-${pgid}\n`);
  }

  #ensure(onError: OnError): ChildProcess | undefined {
    if (this.#child) return this.#child;
    let child: ChildProcess;
    try {
      child = spawn("/bin/sh", ["-c", REAPER_SCRIPT, "slotbroker-job-reaper"], { stdio: ["pipe", "ignore", "ignore"] });
    } catch (err) {
      onError(err as Error);
      return undefined;
    }
    child.on("error", onError);
    child.stdin!.on("error", () => undefined);
    // A reaper that died (killed by hand) is replaced at the next job, told of every group
    // still running. The jobs in between run unwatched.
    child.once("exit", () => {
      if (this.#child === child) this.#child = undefined;
    });
    child.unref();
    (child.stdin as unknown as { unref?: () => void }).unref?.();
    this.#child = child;
    for (const pgid of this.#watched) child.stdin!.write(`+${pgid}\n`);
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

  constructor(pgid: number, onError: OnError) {
    this.#pgid = pgid;
    reaper.add(pgid, onError);
  }

  /** The job is over: stop watching its group (before its id can be reused by another). */
  stop(): void {
    if (this.#stopped) return;
    this.#stopped = true;
    reaper.remove(this.#pgid);
  }
}
