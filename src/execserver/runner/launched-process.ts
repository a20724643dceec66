import { EventEmitter } from "node:events";
import type { Socket } from "node:net";
import { signalGroup } from "./process-group.js";

/**
 * A job started by the job launcher, seen like a ChildProcess by the runner: the execserver
 * holds the job's stdio itself (passed over the launcher's IPC channel); the exit status
 * comes as a message. Events: "exit" and "close" (code, signal) as on a ChildProcess, and
 * "lost" (message) when the launcher died while the job ran, after its group was killed.
 */
export class LaunchedProcess extends EventEmitter {
  #exit: [number | null, NodeJS.Signals | null] | undefined;
  #openStreams = 2;

  constructor(
    readonly pid: number,
    /** null when the job reads /dev/null (spawned without stdin). */
    readonly stdin: Socket | null,
    readonly stdout: Socket,
    readonly stderr: Socket,
  ) {
    super();
    for (const stream of [stdout, stderr]) {
      // Errors surface to the runner as an early end of the stream; never as a crash.
      stream.on("error", () => {});
      // An empty output may have ended (and closed) before its sibling handle arrived.
      if (stream.closed) this.#openStreams--;
      else
        stream.once("close", () => {
          this.#openStreams--;
          this.#maybeClose();
        });
    }
  }

  /** True until the exit status arrived (or the job was lost). */
  get running(): boolean {
    return this.#exit === undefined;
  }

  /** The launcher reaped the job. */
  exited(code: number | null, signal: NodeJS.Signals | null): void {
    if (this.#exit) return;
    this.#exit = [code, signal];
    this.emit("exit", code, signal);
    this.#maybeClose();
  }

  /** The launcher died: nobody can reap the job or tell its status, so its group is killed. */
  lost(message: string): void {
    if (this.#exit) return;
    signalGroup(this.pid, "SIGKILL");
    this.emit("lost", message);
    this.exited(null, "SIGKILL");
  }

  #maybeClose(): void {
    if (this.#exit && this.#openStreams === 0) this.emit("close", ...this.#exit);
  }
}
