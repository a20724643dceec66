import { execFileSync, spawn, type ChildProcess } from "node:child_process";
import { accessSync, constants } from "node:fs";
import type { Socket } from "node:net";
import { join } from "node:path";
import { performance } from "node:perf_hooks";
import { fileURLToPath } from "node:url";
import { silentLogger, type Logger } from "../../shared/log.js";
import { reaperPipe } from "./group-watchdog.js";
import { LaunchedProcess, type LauncherOutput } from "./launched-process.js";
import { LAUNCHER_SCRIPT } from "./launcher-script.js";
import { signalGroup } from "./process-group.js";
import { STDERR_LINE_LIMIT } from "./stderr-line.js";
import { STDOUT_BUFFER_LIMIT } from "./stdout-buffer.js";

/** What a job needs to start; the same fields as the runner's own spawn. */
export interface LaunchSpec {
  readonly file: string;
  readonly args: readonly string[];
  readonly cwd: string;
  readonly env: Readonly<Record<string, string>>;
  /** False: the job reads /dev/null and no stdin handle is passed (default true). */
  readonly stdin?: boolean;
  /**
   * False: no stdout handle is passed; the launcher reads stdout and sends its first
   * STDOUT_BUFFER_LIMIT bytes and its length with the exit (default true). "spill": so
   * while it fits those bytes; once it outgrows them, the handle comes with the bytes read
   * so far (the process emits "spill"). The Node launcher passes the handle at once.
   */
  readonly stdout?: boolean | "spill";
  /**
   * The job's whole stdin: the native launcher writes it and closes stdin, and no stdin
   * handle is passed (`process.stdin` null); any other launcher passes the handle as with
   * `stdin` true, and the caller writes it.
   */
  readonly input?: Uint8Array;
  /** True: `cwd` does not exist yet; the launcher makes it (mode 0700) before the job. */
  readonly dir?: boolean;
}

/**
 * The started job, or why it could not start (an Error with the spawn's `code`; `dir`: the
 * launcher could not make the job's directory).
 */
export type LaunchOutcome = { readonly process: LaunchedProcess } | { readonly error: Error & { code?: string }; readonly dir?: boolean };

/** Options of a JobLauncher (tests shorten the timings). */
export interface JobLauncherOptions {
  /** A launch not answered within this kills the launcher and fails the job (default 10 s). */
  readonly launchTimeoutMs?: number;
  /** After the launcher could not start, jobs use plain spawn for this long (default 10 s). */
  readonly retryAfterMs?: number;
  /**
   * The native launcher to run (native/job-launcher.c): default the built one, when there
   * is one (see nativeLauncherPath); false runs the Node launcher script instead.
   */
  readonly native?: string | false;
  /**
   * The launcher speaks the native one's additions: it passes a job's stdout on only once
   * it outgrew the receipt (LaunchSpec stdout "spill") and writes `input` to the job's
   * stdin itself; default: when it is the native one (tests give a script that does).
   */
  readonly nativeProtocol?: boolean;
  /** node flags of the Node launcher (default: a small young generation). */
  readonly nodeFlags?: readonly string[];
  /** Program of the Node launcher (tests use a broken one). */
  readonly script?: string;
  readonly logger?: Logger;
}

interface PendingLaunch {
  readonly resolve: (outcome: LaunchOutcome) => void;
  readonly timer: NodeJS.Timeout;
  readonly handles: (Socket | undefined)[]; // stdin, stdout
  readonly stdin: boolean;
  readonly stdout: boolean;
  pid: number | undefined;
}

interface FromLauncher {
  readonly t?: unknown;
  readonly id?: unknown;
  readonly n?: unknown;
  readonly pid?: unknown;
  readonly code?: unknown;
  readonly signal?: unknown;
  readonly message?: unknown;
  readonly dir?: unknown;
  readonly err?: unknown;
  readonly open?: unknown;
  readonly rmn?: unknown;
  readonly left?: unknown;
  readonly watched?: unknown;
  readonly out?: unknown;
  readonly outn?: unknown;
}

const DEFAULT_NODE_FLAGS = ["--max-semi-space-size=1", "--v8-pool-size=0"];

/** The native launcher's file name, and the name `ps` shows for either launcher. */
export const LAUNCHER_NAME = "slotbroker-job-launcher";

/**
 * The protocol version the native launcher must answer `--check` with: one built from an
 * older native/job-launcher.c (a stale dist/native/) is not used, rather than failing jobs.
 */
const LAUNCHER_PROTOCOL = "protocol 5";

/** The native launcher's fd of the reaper's pipe (see native/job-launcher.c). */
const REAPER_FD = 4;

/**
 * A finished job's directory waits this long for a spawn message to ride along with (the
 * launcher removes it after starting that job), else goes in a message of its own.
 */
const REMOVE_DELAY_MS = 20;
/**
 * A batch that went with a spawn is confirmed by the next exit; when none came within
 * this long (a long job, then none), an empty batch of its own asks for the confirmation.
 */
const CONFIRM_DELAY_MS = 1000;

const NO_BYTES = Buffer.alloc(0);

/** Bytes as the launcher sends them (hex, at most `limit`); untrusted, so checked. */
function hexBytes(hex: unknown, limit: number): Buffer {
  if (typeof hex !== "string" || hex.length > 2 * limit || !/^(?:[0-9a-f]{2})*$/.test(hex)) return NO_BYTES;
  return Buffer.from(hex, "hex");
}

/** What a launcher's exit or stderr message says of the job's pipes. */
function outputOf(m: FromLauncher): LauncherOutput {
  const out = hexBytes(m.out, STDOUT_BUFFER_LIMIT);
  const outn = typeof m.outn === "number" && Number.isSafeInteger(m.outn) && m.outn > out.length ? m.outn : out.length;
  return { err: hexBytes(m.err, STDERR_LINE_LIMIT), out, outn };
}

let nativeFound: string | null | undefined;

/**
 * The native job launcher when it was built (scripts/build-native.sh) and runs here: next
 * to the running code's src/ (dist/native/ of an installed build, .build/run-N/native/ of a
 * test run), or in dist/native/ when the execserver runs from the checkout's sources. A
 * binary that does not answer `--check` with LAUNCHER_PROTOCOL (built for another machine,
 * C library or protocol) is not used. Looked up once.
 */
export function nativeLauncherPath(): string | undefined {
  if (nativeFound === undefined) {
    const root = fileURLToPath(new URL("../../../", import.meta.url));
    nativeFound = null;
    for (const path of [join(root, "native", LAUNCHER_NAME), join(root, "dist", "native", LAUNCHER_NAME)]) {
      try {
        accessSync(path, constants.X_OK);
      } catch {
        continue; // not built there
      }
      try {
        if (execFileSync(path, ["--check"], { encoding: "utf8", timeout: 5000, stdio: ["ignore", "pipe", "ignore"] }) === `${LAUNCHER_NAME} ok ${LAUNCHER_PROTOCOL}\n`) nativeFound = path;
      } catch {
        // built, but it cannot run here
      }
      break;
    }
  }
  return nativeFound ?? undefined;
}

/**
 * Starts jobs through one small long-lived launcher process: the native one
 * (native/job-launcher.c) when built, else the Node script (launcher-script.ts); both speak
 * the protocol described there. It is started at the first job and replaced after it dies. Jobs it was starting fail as not
 * started; jobs it had started are killed by group and fail as lost. While the launcher
 * cannot be started, `launch` answers undefined and the runner spawns directly.
 */
export class JobLauncher {
  readonly #options: JobLauncherOptions;
  readonly #log: Logger;
  #child: ChildProcess | undefined;
  // The reaper the native launcher registers jobs' groups with, if it was given one.
  #reaper: number | undefined;
  // The launcher running speaks the native one's additions (stdout spill, input).
  #native = false;
  #answered = false;
  #unavailableUntil = 0;
  #nextId = 1;
  readonly #pending = new Map<number, PendingLaunch>();
  readonly #running = new Map<number, LaunchedProcess>();
  // Jobs reaped while another process held their stderr open: its end follows.
  readonly #stderrOpen = new Map<number, LaunchedProcess>();
  // Job directories for the launcher to remove: not sent yet, and sent (by batch number)
  // until a message from the launcher says that batch was done. Each resolves true once
  // removed there, false when it is left to the caller (not empty, or the launcher died).
  #rmQueue: string[] = [];
  #rmTimer: NodeJS.Timeout | undefined;
  #rmBatch = 0;
  // The batch last sent alone, and when: a launcher that does not answer it within the
  // launch timeout is replaced.
  #rmAsked: { readonly batch: number; readonly at: number } | undefined;
  readonly #rmSent = new Map<number, readonly string[]>();
  readonly #rmWaiting = new Map<string, (removed: boolean) => void>();

  constructor(options: JobLauncherOptions = {}) {
    this.#options = options;
    this.#log = (options.logger ?? silentLogger).child({ component: "job-launcher" });
  }

  /** The launcher's process id while one runs (tests kill it). */
  get pid(): number | undefined {
    return this.#child?.pid;
  }

  /** Starts the launcher if none runs; false while none can run (launch answers undefined then). */
  ready(): boolean {
    return this.#ensure() !== undefined;
  }

  /** Starts a job, or answers undefined while no launcher can run (spawn directly then). */
  launch(spec: LaunchSpec): Promise<LaunchOutcome> | undefined {
    const child = this.#ensure();
    if (!child) return undefined;
    const id = this.#nextId++;
    return new Promise((resolve) => {
      const timer = setTimeout(() => {
        this.#log.warn({ pid: child.pid }, "the job launcher did not answer; replacing it");
        child.kill("SIGKILL");
      }, this.#options.launchTimeoutMs ?? 10_000);
      const input = spec.input && this.#native && (spec.stdin ?? true) ? spec.input : undefined;
      const stdin = !input && (spec.stdin ?? true);
      const spill = spec.stdout === "spill" && this.#native;
      const stdout = spec.stdout === "spill" ? !spill : (spec.stdout ?? true);
      this.#pending.set(id, { resolve, timer, handles: [], stdin, stdout, pid: undefined });
      this.#refresh();
      const message = {
        t: "spawn",
        id,
        file: spec.file,
        args: spec.args,
        cwd: spec.cwd,
        env: spec.env,
        stdin: stdin || !!input,
        ...(input ? { input: Buffer.from(input.buffer, input.byteOffset, input.byteLength).toString("hex") } : {}),
        ...(spill ? { stdout: "spill" } : stdout ? {} : { stdout }),
        ...(spec.dir ? { dir: true } : {}),
        ...this.#takeRemovals(),
      };
      child.send(message, (err) => {
        // A failed send means the channel is closing: the disconnect fails this launch.
        if (err) this.#log.debug({ err }, "cannot send to the job launcher");
      });
    });
  }

  /**
   * Has the launcher remove a finished job's (empty) directory, after the next job it
   * starts or within REMOVE_DELAY_MS. Resolves true once it is gone, false when the caller
   * must remove it (it is not empty, or no launcher runs or it died meanwhile).
   */
  removeDir(path: string): Promise<boolean> {
    if (!this.#child || this.#rmWaiting.has(path)) return Promise.resolve(false);
    return new Promise((resolve) => {
      this.#rmWaiting.set(path, resolve);
      this.#rmQueue.push(path);
      if (this.#rmQueue.length === 1) this.#rmLater(REMOVE_DELAY_MS);
      this.#refresh();
    });
  }

  #rmLater(delayMs: number): void {
    clearTimeout(this.#rmTimer);
    this.#rmTimer = setTimeout(this.#sendRemovals, delayMs).unref();
  }

  /** The queued removals as the fields of a spawn message (none: {}). */
  #takeRemovals(): { rm?: string[]; rmn?: number } {
    if (this.#rmQueue.length === 0) return {};
    const batch = this.#newBatch();
    this.#rmLater(CONFIRM_DELAY_MS);
    return batch;
  }

  /** The queued removals as a numbered batch, sent from now on. */
  #newBatch(): { rm: string[]; rmn: number } {
    const rm = this.#rmQueue;
    const rmn = ++this.#rmBatch;
    this.#rmQueue = [];
    this.#rmSent.set(rmn, rm);
    return { rm, rmn };
  }

  /** Sends the queued removals alone (or none, to have earlier batches confirmed). */
  readonly #sendRemovals = (): void => {
    this.#rmTimer = undefined;
    const child = this.#child;
    if (!child) return;
    const timeoutMs = this.#options.launchTimeoutMs ?? 10_000;
    let asked = this.#rmAsked !== undefined && this.#rmSent.has(this.#rmAsked.batch) ? this.#rmAsked : undefined;
    if (asked && performance.now() - asked.at >= timeoutMs) {
      this.#log.warn({ pid: child.pid }, "the job launcher did not answer a removal; replacing it");
      child.kill("SIGKILL");
      return;
    }
    if (this.#rmQueue.length > 0 || (!asked && this.#rmSent.size > 0)) {
      const { rm, rmn } = this.#newBatch();
      asked ??= this.#rmAsked = { batch: rmn, at: performance.now() };
      child.send({ t: "rm", rm, rmn }, () => undefined);
    }
    if (asked) this.#rmLater(Math.max(1, asked.at + timeoutMs - performance.now()));
  };

  /** The launcher's account of removals: `left` were not removed, batches up to `rmn` are done. */
  #removed(m: FromLauncher): void {
    if (Array.isArray(m.left))
      for (const path of m.left as unknown[]) {
        const resolve = typeof path === "string" ? this.#rmWaiting.get(path) : undefined;
        if (!resolve) continue;
        this.#rmWaiting.delete(path as string);
        resolve(false);
      }
    if (typeof m.rmn !== "number") return;
    for (const [batch, paths] of this.#rmSent) {
      if (batch > m.rmn) break;
      this.#rmSent.delete(batch);
      for (const path of paths) {
        const resolve = this.#rmWaiting.get(path);
        this.#rmWaiting.delete(path);
        resolve?.(true);
      }
    }
    if (this.#rmSent.size + this.#rmQueue.length === 0) {
      clearTimeout(this.#rmTimer);
      this.#rmTimer = undefined;
      this.#rmAsked = undefined;
    }
    this.#refresh();
  }

  #ensure(): ChildProcess | undefined {
    if (this.#child) return this.#child;
    if (Date.now() < this.#unavailableUntil) return undefined;
    let child: ChildProcess;
    let reaper: ReturnType<typeof reaperPipe>;
    let native: string | false | undefined;
    try {
      native = this.#options.native ?? nativeLauncherPath();
      const flags = this.#options.nodeFlags ?? DEFAULT_NODE_FLAGS;
      // No execArgv, no NODE_OPTIONS (env is empty): plain node, nothing of tsx or loaders.
      const [file, args] = native ? [native, []] : [process.execPath, [...flags, "-e", this.#options.script ?? LAUNCHER_SCRIPT]];
      // The native launcher registers each job's group with the reaper itself (the Node
      // one could not keep the pipe out of the jobs it spawns).
      reaper = native ? reaperPipe((err) => this.#log.warn({ err }, "cannot start the job reaper")) : undefined;
      child = spawn(file, args, {
        argv0: native ? LAUNCHER_NAME : undefined,
        // stdin: a pipe nobody writes; its EOF tells the launcher the execserver is gone.
        stdio: reaper ? ["pipe", "ignore", "inherit", "ipc", reaper.stream] : ["pipe", "ignore", "inherit", "ipc"],
        env: reaper ? { SLOTBROKER_REAPER_FD: String(REAPER_FD) } : {},
        serialization: "json",
      });
    } catch (err) {
      this.#unavailable(err);
      return undefined;
    }
    if (child.pid === undefined) {
      child.once("error", () => undefined);
      this.#unavailable(new Error("the job launcher could not be spawned"));
      return undefined;
    }
    child.on("error", (err) => this.#log.warn({ err }, "job launcher error"));
    child.on("message", (message: FromLauncher, handle?: Socket) => this.#receive(message, handle));
    child.once("disconnect", () => this.#died(child));
    child.stdin?.on("error", () => undefined);
    (child.stdin as unknown as { unref?: () => void } | null)?.unref?.();
    child.unref();
    this.#child = child;
    this.#reaper = reaper?.generation;
    this.#native = this.#options.nativeProtocol ?? !!native;
    this.#answered = false;
    this.#refresh();
    return child;
  }

  #receive(m: FromLauncher, handle: Socket | undefined): void {
    this.#answered = true;
    if (typeof m !== "object" || m === null) {
      handle?.destroy();
      return;
    }
    if (m.rmn !== undefined || m.left !== undefined) this.#removed(m);
    const id = typeof m.id === "number" ? m.id : -1;
    // Only an "fd" or "spill" message carries a handle.
    if (handle && m.t !== "fd" && m.t !== "spill") handle.destroy();
    if (m.t === "spill") {
      const job = this.#running.get(id) ?? this.#stderrOpen.get(id);
      const head = hexBytes(m.out, STDOUT_BUFFER_LIMIT + 1);
      if (job && handle && head.length > 0) job.spilled(handle, head);
      else {
        handle?.destroy();
        job?.spilled(undefined, NO_BYTES);
      }
      return;
    }
    if (m.t === "exit") {
      const job = this.#running.get(id);
      if (!job) return;
      this.#running.delete(id);
      const open = m.open === true;
      if (open) this.#stderrOpen.set(id, job);
      const child = this.#child;
      const drop = (): void => {
        if (!this.#stderrOpen.delete(id)) return;
        if (child?.connected) child.send({ t: "drop", id }, () => undefined);
        this.#refresh();
      };
      job.exited(typeof m.code === "number" ? m.code : null, typeof m.signal === "string" ? (m.signal as NodeJS.Signals) : null, outputOf(m), open, drop);
      this.#refresh();
      return;
    }
    if (m.t === "stderr") {
      const job = this.#stderrOpen.get(id);
      this.#stderrOpen.delete(id);
      job?.ended(outputOf(m));
      this.#refresh();
      return;
    }
    const pending = this.#pending.get(id);
    if (!pending) {
      handle?.destroy();
      return;
    }
    if (m.t === "failed") {
      const error: Error & { code?: string } = new Error(typeof m.message === "string" ? m.message : "spawn failed");
      if (typeof m.code === "string") error.code = m.code;
      this.#settle(id, m.dir === true ? { error, dir: true } : { error });
      return;
    }
    if (typeof m.pid !== "number") {
      handle?.destroy();
      return;
    }
    // "started": the job runs and no handle was due; "fd": one of its handles.
    if (m.t === "started" && !pending.stdin && !pending.stdout) {
      this.#started(id, pending, m.pid, m.watched === true);
      return;
    }
    if (m.t !== "fd" || (m.n !== 0 && m.n !== 1) || !handle) {
      handle?.destroy();
      return;
    }
    pending.handles[m.n]?.destroy();
    pending.pid = m.pid;
    pending.handles[m.n] = handle;
    if ((pending.stdout && !pending.handles[1]) || (pending.stdin && !pending.handles[0])) return;
    this.#started(id, pending, m.pid, m.watched === true);
  }

  #started(id: number, pending: PendingLaunch, pid: number, watched: boolean): void {
    const [stdin, stdout] = pending.handles;
    // A launcher that passed a handle nobody asked for: nothing is read from or written to it.
    if (!pending.stdin) stdin?.destroy();
    if (!pending.stdout) stdout?.destroy();
    const job = new LaunchedProcess(pid, pending.stdin ? stdin! : null, pending.stdout ? stdout! : null, watched ? this.#reaper : undefined);
    this.#running.set(id, job);
    this.#settle(id, { process: job });
  }

  #settle(id: number, outcome: LaunchOutcome): void {
    const pending = this.#pending.get(id);
    if (!pending) return;
    this.#pending.delete(id);
    clearTimeout(pending.timer);
    pending.resolve(outcome);
    this.#refresh();
  }

  #died(child: ChildProcess): void {
    if (this.#child !== child) return;
    this.#child = undefined;
    const why = `the job launcher (pid ${child.pid}) died`;
    this.#log.warn({ pid: child.pid, pending: this.#pending.size, running: this.#running.size }, "the job launcher died; a new one starts with the next job");
    // One that died before it ever answered would likely die again: spawn directly for a while.
    if (!this.#answered) this.#unavailable(new Error(`${why} before it answered`));
    for (const [id, pending] of this.#pending) {
      if (pending.pid !== undefined) signalGroup(pending.pid, "SIGKILL");
      for (const handle of pending.handles) handle?.destroy();
      this.#settle(id, { error: new Error(`${why} before the job started`) });
    }
    for (const job of this.#running.values()) job.lost(`${why}; the job's process group was killed`);
    this.#running.clear();
    for (const job of this.#stderrOpen.values()) job.lost(why);
    this.#stderrOpen.clear();
    // Whatever it had not removed yet is removed by the execserver.
    clearTimeout(this.#rmTimer);
    this.#rmTimer = undefined;
    this.#rmAsked = undefined;
    this.#rmQueue = [];
    this.#rmSent.clear();
    const waiting = [...this.#rmWaiting.values()];
    this.#rmWaiting.clear();
    for (const resolve of waiting) resolve(false);
    this.#refresh();
  }

  #unavailable(err: unknown): void {
    const retryAfterMs = this.#options.retryAfterMs ?? 10_000;
    this.#unavailableUntil = Date.now() + retryAfterMs;
    this.#log.warn({ err, retryAfterMs }, "cannot use the job launcher; jobs are spawned directly for now");
  }

  /** The channel keeps the process alive only while jobs or removals wait for it. */
  #refresh(): void {
    const channel = this.#child?.channel as { ref?: () => void; unref?: () => void } | undefined;
    if (this.#pending.size + this.#running.size + this.#stderrOpen.size + this.#rmWaiting.size > 0) channel?.ref?.();
    else channel?.unref?.();
  }
}

let shared: JobLauncher | undefined;

/** The process-wide launcher every runner shares unless given its own. */
export function sharedJobLauncher(): JobLauncher {
  shared ??= new JobLauncher();
  return shared;
}
