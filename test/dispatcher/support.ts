// Helpers for the dispatcher tests: tracked pools and dispatchers, condition polling, and
// an in-test exec backend.
//
// About the backend: the real ExecBackend is the fylr's broker client, which does not exist
// yet. For the dispatcher's own logic (admission, retries, requeues, fencing) these tests
// use `TestBackend`, which runs the exec call's command locally with child_process and
// builds a Receipt the way an execserver would. It is NOT a stand-in for integration tests
// against real execservers; those come with the fylr side.
import { spawn, type ChildProcess } from "node:child_process";
import { once } from "node:events";
import { fileURLToPath } from "node:url";
import { Readable } from "node:stream";
import { create } from "@bufbuild/protobuf";
import type pg from "pg";
import { ErrorKind, ReceiptSchema, type Receipt } from "../../gen/slotbroker/v1/broker_pb.js";
import { Dispatcher, type DispatcherOptions, type ExecBackend, type ExecRequest, type ExecResult, type ExecRunOptions } from "../../src/dispatcher/index.js";
import { durationFromMs } from "@bufbuild/protobuf/wkt";
import { release, track } from "../support/resources.js";
import { createPgPool } from "../../src/shared/postgres.js";

/** A pg pool closed by the leak tracker if the test does not. */
export function openPool(url: string, max = 10): pg.Pool {
  const pool = createPgPool({ connectionString: url, max });
  // An idle client's error (server restart) must not crash the test process.
  pool.on("error", () => undefined);
  return track(pool, `pg pool ${max}`, (p) => p.end());
}

/** Creates and starts a dispatcher, tracked so a failing test still stops it. */
export async function startDispatcher(options: DispatcherOptions): Promise<Dispatcher> {
  const dispatcher = new Dispatcher({ migrate: false, ...options });
  track(dispatcher, `dispatcher ${dispatcher.fylrId}`, (d) => d.stop({ graceMs: 0 }).catch(() => undefined));
  await dispatcher.start();
  return dispatcher;
}

/** Stops and untracks dispatchers, then pools. */
export async function closeAll(...resources: (object | undefined)[]): Promise<void> {
  for (const r of resources) await release(r);
}

/** Polls `check` until it returns a value other than undefined/false; fails naming `what` after the deadline. */
export async function waitFor<T>(what: string, check: () => T | undefined | false | Promise<T | undefined | false>, timeoutMs = 20_000): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const value = await check();
    if (value !== undefined && value !== false) return value;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

/** A latch: `wait()` resolves once `open()` was called, or rejects when the signal aborts. */
export class Gate {
  private opened = false;
  private readonly waiters = new Set<() => void>();

  /** Lets every current and future waiter through. */
  open(): void {
    this.opened = true;
    for (const w of this.waiters) w();
    this.waiters.clear();
  }

  /** Waits for open(). */
  wait(signal: AbortSignal): Promise<void> {
    if (this.opened) return Promise.resolve();
    return new Promise((resolve, reject) => {
      const onAbort = (): void => {
        this.waiters.delete(done);
        reject(signal.reason as Error);
      };
      const done = (): void => {
        signal.removeEventListener("abort", onAbort);
        resolve();
      };
      if (signal.aborted) return onAbort();
      signal.addEventListener("abort", onAbort, { once: true });
      this.waiters.add(done);
    });
  }
}

/** A receipt as an execserver would write it. */
export function receiptFor(fields: { exitCode?: number; signal?: string; stdout?: Buffer; stderrLine?: string; error?: ErrorKind; errorMessage?: string; instanceId?: string; durationMs?: number }): Receipt {
  const stdout = fields.stdout ?? Buffer.alloc(0);
  return create(ReceiptSchema, {
    exitCode: fields.exitCode,
    signal: fields.signal ?? "",
    duration: durationFromMs(fields.durationMs ?? 0),
    stderrLine: fields.stderrLine ?? "",
    stdoutPrefix: stdout.subarray(0, 4000),
    stdoutBytes: BigInt(stdout.length),
    stdoutStreamed: stdout.length > 4000,
    error: fields.error ?? ErrorKind.UNSPECIFIED,
    errorMessage: fields.errorMessage ?? "",
    instanceId: fields.instanceId ?? "test-instance",
  });
}

/** service → argv of the test backend. */
export const defaultServices: Record<string, readonly string[]> = {
  cat: ["cat"],
  sha256sum: ["sha256sum"],
  wc: ["wc"],
  sh: ["sh", "-c"],
};

/** Runs one exec call as a local child process (no shell unless the service is `sh`). */
export async function runLocally(request: ExecRequest, options: ExecRunOptions, services = defaultServices): Promise<ExecResult> {
  const argv = services[request.service];
  if (!argv) throw new Error(`test backend: unknown service "${request.service}"`);
  const started = Date.now();
  options.onStart?.("test-instance");
  const child = spawn(argv[0]!, [...argv.slice(1), ...request.args], {
    env: { PATH: process.env.PATH ?? "/usr/bin:/bin", ...request.env },
    stdio: ["pipe", "pipe", "pipe"],
    signal: options.signal,
  });
  const stdout: Buffer[] = [];
  let stderr = "";
  child.stdout.on("data", (b: Buffer) => stdout.push(b));
  child.stderr.on("data", (b: Buffer) => (stderr += b.toString()));
  child.stdin.on("error", () => undefined); // EPIPE when the command does not read stdin
  if (request.stdin instanceof URL) {
    const res = await fetch(request.stdin, { signal: options.signal });
    if (!res.ok || !res.body) throw new Error(`stdin URL answered ${res.status}`);
    Readable.fromWeb(res.body).pipe(child.stdin);
  } else {
    child.stdin.end(request.stdin ?? Buffer.alloc(0));
  }
  const [code, signal] = await new Promise<[number | null, NodeJS.Signals | null]>((resolve, reject) => {
    child.once("error", reject);
    child.once("close", (c, s) => resolve([c, s]));
  });
  const out = Buffer.concat(stdout);
  const stderrLine = stderr.trim().split("\n").pop() ?? "";
  return {
    receipt: receiptFor({ exitCode: code ?? undefined, signal: signal ?? "", stdout: out, stderrLine, durationMs: Date.now() - started }),
    stdout: out,
  };
}

/** An ExecBackend for dispatcher-logic tests; `handler` defaults to running the command locally. */
export class TestBackend implements ExecBackend {
  readonly requests: ExecRequest[] = [];
  constructor(private readonly handler: (request: ExecRequest, options: ExecRunOptions) => Promise<ExecResult> = runLocally) {}

  /** Records the request and hands it to the handler. */
  run(request: ExecRequest, options: ExecRunOptions): Promise<ExecResult> {
    this.requests.push(request);
    return this.handler(request, options);
  }
}

/** A fixed number of slots shared by several backends, like one execserver's waitgroup. */
export class SlotModel {
  private free: number;
  private readonly queue: (() => void)[] = [];
  constructor(readonly slots: number) {
    this.free = slots;
  }

  /** Waits for a slot (FIFO); rejects on abort. Returns the release function. */
  async acquire(signal: AbortSignal): Promise<() => void> {
    if (this.free > 0) {
      this.free -= 1;
    } else {
      await new Promise<void>((resolve, reject) => {
        const grant = (): void => {
          signal.removeEventListener("abort", onAbort);
          resolve();
        };
        const onAbort = (): void => {
          const i = this.queue.indexOf(grant);
          if (i >= 0) this.queue.splice(i, 1);
          reject(signal.reason as Error);
        };
        signal.addEventListener("abort", onAbort, { once: true });
        this.queue.push(grant);
      });
    }
    let released = false;
    return () => {
      if (released) return;
      released = true;
      const next = this.queue.shift();
      if (next) next();
      else this.free += 1;
    };
  }
}

const claimer = fileURLToPath(new URL("./fixtures/claimer.ts", import.meta.url));

/** Starts a claimer process; collects its JSON lines. Tracked: killed if the test leaves it. */
/** Starts fixtures/claimer.ts in its own process; see that file for the modes. */
export function startClaimer(args: string[]): { child: ChildProcess; lines: Record<string, unknown>[]; exited: Promise<number | null> } {
  const child = spawn(process.execPath, ["--import", "tsx", claimer, ...args], { stdio: ["ignore", "pipe", "inherit"] });
  track(child, `claimer ${args[0]}`, (c) => {
    if (c.exitCode === null && c.signalCode === null) c.kill("SIGKILL");
  });
  const lines: Record<string, unknown>[] = [];
  let rest = "";
  child.stdout.setEncoding("utf8");
  child.stdout.on("data", (chunk: string) => {
    const parts = (rest + chunk).split("\n");
    rest = parts.pop() ?? "";
    for (const p of parts) if (p.trim()) lines.push(JSON.parse(p) as Record<string, unknown>);
  });
  const exited = once(child, "exit").then(([code]) => code as number | null);
  return { child, lines, exited };
}
