import { EventEmitter } from "node:events";
import type { Socket } from "node:net";
import { signalGroup } from "./process-group.js";
import { lineFromBytes } from "./stderr-line.js";

const NO_BYTES = Buffer.alloc(0);

/**
 * What the launcher read of a job's pipes: the raw bytes of stderr's last non-empty line
 * (empty: none), and, when it read stdout too, its first bytes and how many there were.
 */
export interface LauncherOutput {
  readonly err: Buffer;
  readonly out: Buffer;
  readonly outn: number;
}

const NO_OUTPUT: LauncherOutput = { err: NO_BYTES, out: NO_BYTES, outn: 0 };

/**
 * A job started by the job launcher, seen like a ChildProcess by the runner: the execserver
 * holds the job's stdin and stdout itself (passed over the launcher's IPC channel), or the
 * launcher reads stdout (`stdout` null) and sends its first bytes with the exit, or, when
 * it outgrew them, passes it on with the bytes it read ("spill"); the launcher reads its
 * stderr and sends the last line's bytes with the exit status, or after it when another
 * process still held a pipe it reads open at the exit. Events: "exit" and "close" (code,
 * signal) as on a ChildProcess, "spill" when `stdout` was set (see stdoutHead; still null:
 * the launcher could not pass it), and "lost" (message) when the launcher died while the
 * job ran, after its group was killed.
 */
export class LaunchedProcess extends EventEmitter {
  readonly stderr = null;
  #stdout: Socket | null;
  #head: Buffer | undefined;
  #closed = false;
  #exit: [number | null, NodeJS.Signals | null] | undefined;
  #stdoutOpen: boolean;
  // undefined until the launcher sent the end of the pipes it reads (or the runner stopped waiting).
  #output: LauncherOutput | undefined;
  // What came with the exit, while a pipe read there is still open elsewhere.
  #soFar: LauncherOutput = NO_OUTPUT;
  #abandoned = false;
  // An exit that came before anyone listened was put off once.
  #exitPutOff = false;
  // Set when the exit came without the pipes' end: asks the launcher to stop reading them.
  #drop: (() => void) | undefined;

  constructor(
    readonly pid: number,
    /** null when the job reads /dev/null (spawned without stdin). */
    readonly stdin: Socket | null,
    /** null when the launcher reads stdout itself (see stdoutKept), until it spills. */
    stdout: Socket | null,
    /** The reaper the launcher registered the job's group with (see GroupWatchdog). */
    readonly watchedBy: number | undefined,
  ) {
    super();
    this.#stdout = stdout;
    this.#stdoutOpen = false;
    if (stdout) this.#hold(stdout);
  }

  get stdout(): Socket | null {
    return this.#stdout;
  }

  #hold(stdout: Socket): void {
    // An empty output may have ended (and closed) before the exit message arrived.
    this.#stdoutOpen = !stdout.closed;
    // Errors surface to the runner as an early end of the stream; never as a crash.
    stdout.on("error", () => {});
    if (this.#stdoutOpen)
      stdout.once("close", () => {
        this.#stdoutOpen = false;
        this.#maybeClose();
      });
  }

  /**
   * The launcher passed stdout on, with the bytes it had read of it (`head`, before the
   * socket's); `stdout` undefined: it sent them without the handle, so the rest is lost.
   */
  spilled(stdout: Socket | undefined, head: Buffer): void {
    if (this.#stdout || this.#head || this.#abandoned || this.#closed) {
      stdout?.destroy();
      return;
    }
    this.#head = head;
    if (stdout) {
      this.#stdout = stdout;
      this.#hold(stdout);
    }
    this.emit("spill");
  }

  /** The bytes of stdout the launcher read before it passed `stdout` on. */
  stdoutHead(): Buffer | undefined {
    return this.#head;
  }

  /** True until the exit status arrived (or the job was lost). */
  get running(): boolean {
    return this.#exit === undefined;
  }

  /**
   * The launcher reaped the job, with what it read of the pipes; `open`: another process
   * still holds one of them open, so that is only what came so far: `ended` follows, and
   * `drop` tells the launcher to stop reading should the runner give up on the pipes.
   */
  exited(code: number | null, signal: NodeJS.Signals | null, output: LauncherOutput, open: boolean, drop: () => void): void {
    if (this.#exit) return;
    // The exit came in the same turn as the start (no handle passed in between, so nothing
    // held it back): it is told once the runner, told of the start, listens.
    if (this.listenerCount("exit") === 0 && !this.#exitPutOff) {
      this.#exitPutOff = true;
      setImmediate(() => this.exited(code, signal, output, open, drop));
      return;
    }
    this.#exit = [code, signal];
    if (!open) this.ended(output);
    else if (this.#abandoned) drop();
    else {
      this.#soFar = output;
      this.#drop = drop;
    }
    this.emit("exit", code, signal);
    this.#maybeClose();
  }

  /** The pipes the launcher reads reached their end (after the exit). */
  ended(output: LauncherOutput): void {
    if (this.#output !== undefined) return;
    this.#output = output;
    this.#drop = undefined;
    this.#maybeClose();
  }

  stderrLine(): string {
    return lineFromBytes(this.#output?.err ?? NO_BYTES);
  }

  /** stdout read by the launcher: its first bytes and how many there were in all. */
  stdoutKept(): { readonly prefix: Buffer; readonly total: number } {
    const output = this.#output ?? NO_OUTPUT;
    return { prefix: output.out, total: output.outn };
  }

  abandonPipes(): void {
    if (this.#abandoned) return;
    this.#abandoned = true;
    this.#drop?.();
    this.ended(this.#soFar);
  }

  /** The launcher died: nobody can reap the job or tell its status, so its group is killed. */
  lost(message: string): void {
    if (this.#exit) {
      this.ended(this.#soFar);
      return;
    }
    signalGroup(this.pid, "SIGKILL");
    this.emit("lost", message);
    this.exited(null, "SIGKILL", NO_OUTPUT, false, () => undefined);
  }

  #maybeClose(): void {
    if (this.#exit && !this.#stdoutOpen && this.#output !== undefined && !this.#closed) {
      this.#closed = true;
      this.emit("close", ...this.#exit);
    }
  }
}
