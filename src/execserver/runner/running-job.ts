import { performance } from "node:perf_hooks";
import { ErrorKind, type Receipt } from "../../../gen/slotbroker/v1/broker_pb.js";
import { AbortReason } from "../../shared/abort.js";
import type { Logger } from "../../shared/log.js";
import { GroupWatchdog } from "./group-watchdog.js";
import { ProcessGroup } from "./process-group.js";
import { receiptFromOutcome, type JobFailure } from "./receipt.js";
import { MAX_TIMEOUT_MS, parsePipeUrl } from "./request-check.js";
import { LastLineTracker } from "./stderr-line.js";
import { pipeStdin, type StdinPipe } from "./stdin-pipe.js";
import { StdoutBuffer } from "./stdout-buffer.js";
import { StdoutUpload } from "./stdout-upload.js";
import { pipeStdinStream, StreamSink } from "./stream-stdio.js";
import type { JobProcess, RunRequest, StdoutSink } from "./types.js";

const NO_STDOUT = { prefix: new Uint8Array(0), total: 0 };

/** Default delay between SIGTERM and SIGKILL. */
export const DEFAULT_KILL_GRACE_MS = 2000;

/**
 * One spawned job, from its first byte to its receipt. Every failure the runner sees or
 * causes (timeout, cancel, a pipe) goes through `fail`: the first one is recorded, and it
 * stops the process group and both pipes.
 */
export class RunningJob {
  readonly #child: JobProcess;
  readonly #request: RunRequest;
  readonly #parentLog: Logger;
  readonly #bindings: Record<string, unknown> | undefined;
  #childLog: Logger | undefined;
  readonly #group: ProcessGroup;
  readonly #watchdog: GroupWatchdog;
  readonly #stdout = new StdoutBuffer();
  readonly #stderr = new LastLineTracker();
  readonly #upload: StdoutSink | undefined;
  #stdin: StdinPipe | undefined;
  #failure: JobFailure | undefined;

  /** `bindings` name the job in its log lines (`log.child(bindings)`, made at the first line). */
  constructor(child: JobProcess, request: RunRequest, log: Logger, bindings?: Record<string, unknown>) {
    this.#child = child;
    this.#request = request;
    this.#parentLog = log;
    this.#bindings = bindings;
    this.#group = new ProcessGroup(child.pid, request.killGraceMs ?? DEFAULT_KILL_GRACE_MS, () => this.#abandonPipes());
    this.#watchdog = new GroupWatchdog(child.pid, (err) => this.#log.warn({ err }, "cannot watch the job's process group"), child.watchedBy);
    const stdoutUrl = request.stdoutUrl ? parsePipeUrl(request.stdoutUrl) : undefined;
    const onFail = (message: string): void => this.fail(ErrorKind.PIPE_FAILED, message);
    this.#upload = stdoutUrl ? new StdoutUpload(stdoutUrl, onFail, request.pipeCa) : request.stdout && new StreamSink(request.stdout, onFail);
  }

  // A child logger costs more than most of a quick job's bookkeeping, and most jobs log nothing.
  get #log(): Logger {
    return (this.#childLog ??= this.#bindings ? this.#parentLog.child(this.#bindings) : this.#parentLog);
  }

  /** Records the job's failure (first one wins) and stops the process and its pipes. */
  fail(kind: ErrorKind, message: string, graceMs?: number): void {
    if (this.#failure) return;
    this.#failure = { kind, message };
    this.#log.info({ error: ErrorKind[kind], message }, "stopping job");
    this.#stdin?.stop();
    this.#upload?.abort(message);
    this.#group.terminate(graceMs);
  }

  /** Runs the job to its end; the spawned process must not have been touched yet. */
  async run(): Promise<Receipt> {
    const { signal, timeoutMs } = this.#request;
    const startedAt = performance.now();
    let exitedAt: number | undefined;
    this.#child.once("exit", () => (exitedAt = performance.now()));
    this.#child.once("lost", (message: string) => this.fail(ErrorKind.KILLED, message));
    const timer = setTimeout(() => this.fail(ErrorKind.TIMEOUT, `timed out after ${timeoutMs} ms`), Math.min(timeoutMs, MAX_TIMEOUT_MS));
    const onAbort = (): void => {
      const requested = signal.reason instanceof AbortReason && signal.reason.kind === "cancel-requested";
      if (requested) this.fail(ErrorKind.CANCEL_REQUESTED, `cancel requested: ${reasonText(signal.reason)}`, this.#request.cancelGraceMs);
      else this.fail(ErrorKind.CANCELLED, `cancelled: ${reasonText(signal.reason)}`);
    };
    signal.addEventListener("abort", onAbort, { once: true });
    try {
      const closed = this.#closed();
      this.#child.stderr?.on("data", (chunk: Buffer) => this.#stderr.push(chunk));
      let drained = this.#drainStdout();
      // The launcher passes stdout on (before the "close") once it outgrew the receipt; a
      // spill without the pipe (no stdout, but its head) may have come before this listened.
      const spilledEarly = !this.#child.stdout && this.#child.stdoutHead?.() !== undefined;
      if (!this.#child.stdout && !spilledEarly) this.#child.once("spill", () => (drained = this.#spilled()));
      this.#startStdin();
      if (signal.aborted) onAbort();
      if (spilledEarly) drained = this.#spilled();
      const [exitCode, exitSignal] = await closed;
      await drained;
      const stdout = this.#child.stdout ? { prefix: this.#stdout.prefix(), total: this.#stdout.total } : (this.#child.stdoutKept?.() ?? NO_STDOUT);
      // The leader is reaped: kill stragglers now, while its group id is still the job's
      // (the watchdog first, so it never signals a group id that could be reused later).
      this.#watchdog.stop();
      this.#group.release();
      this.#stdin?.stop();
      await this.#settleUpload(exitCode, exitSignal);
      return receiptFromOutcome({
        exitCode,
        signal: exitSignal,
        durationMs: (exitedAt ?? performance.now()) - startedAt,
        ...(this.#failure ? { failure: this.#failure } : {}),
        stderrLine: this.#child.stderr ? this.#stderr.line() : (this.#child.stderrLine?.() ?? ""),
        stdoutPrefix: stdout.prefix,
        stdoutBytes: stdout.total,
        stdoutStreamed: this.#upload?.started ?? false,
        uploadAborted: this.#upload?.aborted ?? false,
      });
    } finally {
      clearTimeout(timer);
      signal.removeEventListener("abort", onAbort);
      this.#stdin?.stop();
      this.#upload?.abort("the runner stopped");
      this.#watchdog.stop();
      this.#group.release();
      this.#abandonPipes();
    }
  }

  /** Resolves with (code, signal) once the process exited and its stdio closed. */
  #closed(): Promise<[number | null, NodeJS.Signals | null]> {
    return new Promise((resolve) => {
      this.#child.once("close", (code: number | null, sig: NodeJS.Signals | null) => resolve([code, sig]));
      this.#child.on("error", (err) => this.#log.warn({ err }, "child process error"));
    });
  }

  #startStdin(): void {
    const stdin = this.#child.stdin;
    if (!stdin) return; // no source (the job reads /dev/null), or the launcher writes it (input)
    // Writes to a child that has exited fail with EPIPE; never let that crash the process.
    stdin.on("error", (err) => this.#log.debug({ err }, "child stdin error"));
    const onFail = (message: string): void => this.fail(ErrorKind.PIPE_FAILED, message);
    if (this.#request.stdin) {
      this.#stdin = pipeStdinStream(this.#request.stdin, stdin, onFail, this.#log);
      return;
    }
    if (this.#request.stdinInline?.byteLength) {
      // Already in memory: one write, then EOF. A child that exits unread gets EPIPE (logged above).
      stdin.end(this.#request.stdinInline);
      return;
    }
    const url = this.#request.stdinUrl ? parsePipeUrl(this.#request.stdinUrl) : undefined;
    if (!url) {
      stdin.end();
      return;
    }
    this.#stdin = pipeStdin(url, stdin, onFail, this.#log, this.#request.pipeCa);
  }

  #spilled(): Promise<void> {
    if (!this.#child.stdout) this.fail(ErrorKind.PIPE_FAILED, "the job launcher could not pass the job's stdout on");
    return this.#drainStdout();
  }

  /**
   * Reads stdout to its end, after the bytes the launcher read of it if it passed it on.
   * Pausing while an upload write is pending is the backpressure: while the receiver is
   * slow, stdout is not read and the child blocks on its full pipe.
   * Plain "data" events: an async iterator over the stream cost ~0.1 ms per job.
   */
  #drainStdout(): Promise<void> {
    const stdout = this.#child.stdout;
    const upload = this.#upload;
    let writing: Promise<void> = Promise.resolve();
    const onData = (chunk: Buffer): void => {
      const step = this.#stdout.push(chunk);
      // Without an upload (no stdout URL), output past the buffer is counted and dropped.
      if (step.kind === "hold" || !upload) return;
      stdout?.pause();
      const resume = (): void => void stdout?.resume();
      writing = upload.write(step.data).then(resume, resume);
    };
    const head = this.#child.stdoutHead?.();
    if (head) onData(head);
    // Read by the launcher; only after #abandonPipes; or (launcher) an empty output that ended before it arrived.
    if (!stdout || stdout.destroyed || stdout.readableEnded) return writing;
    return new Promise((resolve) => {
      let ended = false;
      let finished = false;
      const finish = (): void => {
        if (finished) return;
        finished = true;
        stdout.off("data", onData);
        // The receipt explains the job's end; a stream destroyed by #abandonPipes ends here too.
        if (!ended) this.#log.debug("stdout closed abruptly");
        void writing.then(resolve, resolve);
      };
      stdout.on("data", onData);
      stdout.on("error", (err) => this.#log.debug({ err }, "stdout failed"));
      stdout.once("end", () => {
        ended = true;
        finish();
      });
      stdout.once("close", finish);
    });
  }

  /** Completes the upload only after a clean success; otherwise the receiver sees it abort. */
  async #settleUpload(exitCode: number | null, exitSignal: NodeJS.Signals | null): Promise<void> {
    const upload = this.#upload;
    if (!upload?.started) return;
    if (this.#failure || exitSignal !== null || exitCode !== 0) {
      upload.abort(exitSignal ? `process killed by ${exitSignal}` : `process exited with code ${exitCode}`);
      return;
    }
    await upload.finish();
  }

  /** Stops waiting for pipes held open by processes that escaped the group's kill. */
  #abandonPipes(): void {
    this.#child.stdin?.destroy();
    this.#child.stdout?.destroy();
    this.#child.stderr?.destroy();
    this.#child.abandonPipes?.();
  }
}

function reasonText(reason: unknown): string {
  if (reason instanceof Error) return reason.message;
  return typeof reason === "string" ? reason : "aborted";
}
