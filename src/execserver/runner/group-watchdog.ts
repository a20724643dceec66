import { spawn, type ChildProcess } from "node:child_process";

// Blocks on a read of its stdin, a pipe whose only writer is the execserver. Nothing is
// ever written: the read returns only at EOF, i.e. when the execserver closed the pipe or
// died (the kernel closes a dead process's descriptors). Then it kills the job's group.
const WATCH_SCRIPT = 'read -r _ignored; kill -s KILL -- "-$1" 2>/dev/null';

/**
 * A tiny `sh` per job that kills the job's process group when the execserver dies, even
 * by SIGKILL (Node has no parent-death signal). So a job never outlives its execserver by
 * more than the moment the kernel takes to close the dead process's pipes.
 */
export class GroupWatchdog {
  readonly #child: ChildProcess | undefined;

  constructor(pgid: number, onError: (err: Error) => void) {
    let child: ChildProcess | undefined;
    try {
      child = spawn("/bin/sh", ["-c", WATCH_SCRIPT, "slotbroker-job-watchdog", String(pgid)], { stdio: ["pipe", "ignore", "ignore"] });
    } catch (err) {
      onError(err as Error);
    }
    this.#child = child;
    if (!child) return;
    child.on("error", onError);
    child.stdin!.on("error", () => undefined);
    child.unref();
    (child.stdin as unknown as { unref?: () => void }).unref?.();
  }

  /** The job is over: stop watching without killing (SIGKILL, so EOF never reaches it). */
  stop(): void {
    const child = this.#child;
    if (!child || child.exitCode !== null || child.signalCode !== null) return;
    child.kill("SIGKILL");
    child.stdin!.destroy();
  }
}
