import { EventEmitter } from "node:events";
import type { Socket } from "node:net";
import { signalGroup } from "./process-group.js";
import { lineFromBytes } from "./stderr-line.js";

const NO_BYTES = Buffer.alloc(0);

/**
 * A job started by the job launcher, seen like a ChildProcess by the runner: the execserver
 * holds the job's stdin and stdout itself (passed over the launcher's IPC channel); the
 * launcher reads its stderr and sends the last line's bytes with the exit status, or after
 * it when another process still held stderr open at the exit. Events: "exit" and "close"
 * (code, signal) as on a ChildProcess, and "lost" (message) when the launcher died while
 * the job ran, after its group was killed.
 */
export class LaunchedProcess extends EventEmitter {
  readonly stderr = null;
  #exit: [number | null, NodeJS.Signals | null] | undefined;
  #stdoutOpen = true;
  // undefined until the launcher sent stderr's end (or the runner stopped waiting for it).
  #stderrLine: string | undefined;
  // The line as of the exit, while stderr is still open elsewhere.
  #stderrSoFar: Buffer = NO_BYTES;
  #abandoned = false;
  // Set when the exit came without stderr's end: asks the launcher to stop reading it.
  #drop: (() => void) | undefined;

  constructor(
    readonly pid: number,
    /** null when the job reads /dev/null (spawned without stdin). */
    readonly stdin: Socket | null,
    readonly stdout: Socket,
    /** The reaper the launcher registered the job's group with (see GroupWatchdog). */
    readonly watchedBy: number | undefined,
  ) {
    super();
    // Errors surface to the runner as an early end of the stream; never as a crash.
    stdout.on("error", () => {});
    // An empty output may have ended (and closed) before the exit message arrived.
    if (stdout.closed) this.#stdoutOpen = false;
    else
      stdout.once("close", () => {
        this.#stdoutOpen = false;
        this.#maybeClose();
      });
  }

  /** True until the exit status arrived (or the job was lost). */
  get running(): boolean {
    return this.#exit === undefined;
  }

  /**
   * The launcher reaped the job. `stderr`: the raw bytes of stderr's last non-empty line
   * (empty: none); `open`: another process still holds stderr open, so that line is only
   * the one so far: `stderrEnded` follows, and `drop` tells the launcher to stop reading
   * should the runner give up on the pipes.
   */
  exited(code: number | null, signal: NodeJS.Signals | null, stderr: Buffer, open: boolean, drop: () => void): void {
    if (this.#exit) return;
    this.#exit = [code, signal];
    if (!open) this.stderrEnded(stderr);
    else if (this.#abandoned) drop();
    else {
      this.#stderrSoFar = stderr;
      this.#drop = drop;
    }
    this.emit("exit", code, signal);
    this.#maybeClose();
  }

  /** stderr reached its end (after the exit): the bytes of its last non-empty line. */
  stderrEnded(bytes: Buffer): void {
    if (this.#stderrLine !== undefined) return;
    this.#stderrLine = lineFromBytes(bytes);
    this.#drop = undefined;
    this.#maybeClose();
  }

  stderrLine(): string {
    return this.#stderrLine ?? "";
  }

  abandonStderr(): void {
    if (this.#abandoned) return;
    this.#abandoned = true;
    this.#drop?.();
    this.stderrEnded(this.#stderrSoFar);
  }

  /** The launcher died: nobody can reap the job or tell its status, so its group is killed. */
  lost(message: string): void {
    if (this.#exit) {
      this.stderrEnded(this.#stderrSoFar);
      return;
    }
    signalGroup(this.pid, "SIGKILL");
    this.emit("lost", message);
    this.exited(null, "SIGKILL", NO_BYTES, false, () => undefined);
  }

  #maybeClose(): void {
    if (this.#exit && !this.#stdoutOpen && this.#stderrLine !== undefined) this.emit("close", ...this.#exit);
  }
}
