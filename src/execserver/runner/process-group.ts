import { Transitions } from "../../shared/lifecycle.js";

/** Sends `signal` to every process in group `pgid`; false when no such group is left. */
export function signalGroup(pgid: number, signal: NodeJS.Signals): boolean {
  // Every finished job's group gets a SIGKILL that almost always finds it gone (ESRCH), and
  // process.kill reports that by throwing: without a stack the error costs far less.
  const stackTraceLimit = Error.stackTraceLimit;
  Error.stackTraceLimit = 0;
  try {
    // A negative pid addresses the whole process group (kill(2)); the job runs detached,
    // so its group id is its own pid and grandchildren are reached too.
    process.kill(-pgid, signal);
    return true;
  } catch (err) {
    const code = (err as { code?: unknown }).code;
    // ESRCH: the group is gone. EPERM: what is left is no longer ours to signal.
    if (code === "ESRCH" || code === "EPERM") return false;
    throw err;
  } finally {
    Error.stackTraceLimit = stackTraceLimit;
  }
}

type GroupState = "running" | "terminating" | "killing" | "released";

const transitions = new Transitions<GroupState>("process group", {
  running: ["terminating", "released"],
  terminating: ["killing", "released"],
  killing: ["released"],
  released: [],
});

/**
 * Stops a job's process group: SIGTERM, SIGKILL after `graceMs`, and if the job still has
 * not closed its pipes another `graceMs` later (a process that left the group can hold
 * them), `onStuck` so the runner can stop waiting for them.
 */
export class ProcessGroup {
  #state: GroupState = "running";
  #timer: NodeJS.Timeout | undefined;

  constructor(
    readonly pgid: number,
    readonly graceMs: number,
    private readonly onStuck: () => void,
  ) {}

  /** Begins the graceful-then-forceful stop (SIGKILL after `graceMs`); idempotent. */
  terminate(graceMs = this.graceMs): void {
    if (this.#state !== "running") return;
    this.#setState("terminating");
    signalGroup(this.pgid, "SIGTERM");
    this.#timer = setTimeout(() => this.#kill(), graceMs);
  }

  /**
   * The job is over: stop the timers and SIGKILL whatever is left in its group, so no
   * background process a job started outlives it. Call as soon as the leader is reaped
   * (while its group id cannot have been reused by anything but the job); idempotent.
   */
  release(): void {
    if (this.#state === "released") return;
    clearTimeout(this.#timer);
    this.#setState("released");
    signalGroup(this.pgid, "SIGKILL");
  }

  #kill(): void {
    if (this.#state !== "terminating") return;
    this.#setState("killing");
    signalGroup(this.pgid, "SIGKILL");
    this.#timer = setTimeout(() => {
      if (this.#state === "killing") this.onStuck();
    }, this.graceMs);
  }

  #setState(next: GroupState): void {
    this.#state = transitions.check(this.#state, next);
  }
}
