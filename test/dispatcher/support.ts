// Helpers for the dispatcher tests: tracked pools and dispatchers, waits on the
// dispatcher's events, and an in-test exec backend.
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
import {
  Dispatcher,
  type ClaimedItem,
  type DispatcherEvents,
  type DispatcherOptions,
  type ExecBackend,
  type ExecRequest,
  type ExecResult,
  type ExecRunOptions,
  type QueueItem,
} from "../../src/dispatcher/index.js";
import { Events } from "../../src/shared/typed-events.js";
import { awaitCondition, EventMonitor, type WakeSource } from "../support/event-monitor.js";
import { durationFromMs } from "@bufbuild/protobuf/wkt";
import { release, track } from "../../harness/resources.js";
import { createPgPool } from "../../src/shared/postgres.js";
import { nodeScript } from "../../harness/node-children.js";

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

// The event after which an item is in each state: every one is emitted once the state is written.
const reachedBy = { running: "item:started", succeeded: "item:succeeded", failed: "item:failed", queued: "item:requeued" } as const;
type Reachable = keyof typeof reachedBy;

/**
 * Resolves with the item once it is in one of `states`, woken by the dispatcher's events
 * for that item (listening starts before the first look, so no change falls in between).
 */
export function itemReaches(d: Dispatcher, id: string, states: readonly Reachable[], timeoutMs = 20_000): Promise<QueueItem> {
  const forThisItem: WakeSource = (wake) => {
    const stops = states.map((state) => d.events.on(reachedBy[state], ((item: ClaimedItem) => item.id === id && wake()) as (...args: DispatcherEvents[(typeof reachedBy)[Reachable]]) => void));
    return () => stops.forEach((stop) => stop());
  };
  return awaitCondition(`item ${id} to reach ${states.join("/")}`, [forThisItem], async () => {
    const item = await d.get(id);
    return item && (states as readonly string[]).includes(item.state) ? item : undefined;
  }, timeoutMs);
}

/** Resolves once each dispatcher ran `n` more loop passes: long enough to have looked again. */
export async function morePasses(list: readonly Dispatcher[], n: number): Promise<void> {
  await Promise.all(list.map((d) => new EventMonitor(d.events, "pass")).map(async (m) => {
    try {
      await m.awaitCount(n);
    } finally {
      m.release();
    }
  }));
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

/** A claimer process: its JSON lines so far, and a wait for the first line that passes a filter. */
export interface Claimer {
  readonly child: ChildProcess;
  readonly lines: Record<string, unknown>[];
  readonly exited: Promise<number | null>;
  /** The first line (printed so far or later) that passes `filter`; rejects if the process exits first. */
  awaitLine(filter: (line: Record<string, unknown>) => boolean): Promise<Record<string, unknown>>;
}

/** Starts fixtures/claimer.ts in its own process; see that file for the modes. Tracked: killed if the test leaves it. */
export function startClaimer(args: string[]): Claimer {
  const child = spawn(process.execPath, [...nodeScript(claimer), ...args], { stdio: ["ignore", "pipe", "inherit"] });
  track(child, `claimer ${args[0]}`, (c) => {
    if (c.exitCode === null && c.signalCode === null) c.kill("SIGKILL");
  });
  const lines: Record<string, unknown>[] = [];
  const printed = new Events<{ line: [Record<string, unknown>] }>();
  let rest = "";
  child.stdout.setEncoding("utf8");
  child.stdout.on("data", (chunk: string) => {
    const parts = (rest + chunk).split("\n");
    rest = parts.pop() ?? "";
    for (const p of parts) {
      if (!p.trim()) continue;
      const line = JSON.parse(p) as Record<string, unknown>;
      lines.push(line);
      printed.emit("line", line);
    }
  });
  const exited = once(child, "exit").then(([code]) => code as number | null);
  const awaitLine = async (filter: (line: Record<string, unknown>) => boolean): Promise<Record<string, unknown>> => {
    const found = lines.find(filter);
    if (found) return found;
    const stop = new AbortController();
    try {
      const gone = exited.then((code) => Promise.reject(new Error(`claimer ${args[0]} exited (${code}) before the line awaited`)));
      const [line] = await Promise.race([printed.next("line", { filter, signal: stop.signal }), gone]);
      return line;
    } finally {
      stop.abort();
    }
  };
  return { child, lines, exited, awaitLine };
}
