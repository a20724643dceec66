// Helpers for the queue API, fylr-process and command tests: fylrs in this process or as
// `slotbroker fylr` child processes, a QueueService client, database pools. Everything
// started here is tracked (harness/resources.ts).
import { spawn, type ChildProcess } from "node:child_process";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import type pg from "pg";
import { stringify } from "yaml";
import { createQueueClient, type ApiCredentials, type QueueClient } from "../../src/api/index.js";
import { compileFylrConfig, startFylr, type FylrConfigInput, type FylrHandle } from "../../src/app/index.js";
import { release, track } from "../../harness/resources.js";
import { createPgPool } from "../../src/shared/postgres.js";
import { waitForOutput } from "../../harness/child-output.js";
import { slotbrokerArgs } from "../../harness/node-children.js";

export const root = resolve(dirname(fileURLToPath(import.meta.url)), "..", "..");
export const cli = join(root, "src", "cli.ts");

/** Test timings: quick heartbeats and polls, short waits for a slot. */
export function fastFylrConfig(databaseUrl: string, addresses: string[], extra: Partial<FylrConfigInput> = {}): FylrConfigInput {
  return {
    listen: "127.0.0.1:0",
    databaseUrl,
    databasePoolSize: 4,
    ...extra,
    execserver: {
      addresses,
      connectTimeout: "10s",
      retryTick: "200ms",
      reconnectInitial: "50ms",
      reconnectMax: "500ms",
      startupGrace: "2s",
      positionInterval: "100ms",
      ...extra.execserver,
    },
    dispatcher: { pollInterval: "100ms", heartbeatInterval: "200ms", staleAfter: "2s", stopGrace: "2s", retryInitial: "100ms", ...extra.dispatcher },
    api: { watchPoll: "100ms", ...extra.api },
  };
}

/** A fylr in this process, tracked (force-closed if the test does not close it). */
export async function startTestFylr(input: FylrConfigInput): Promise<FylrHandle> {
  const fylr = await startFylr(compileFylrConfig(input, "test fylr"));
  return track(fylr, `fylr ${fylr.id}`, (f) => f.forceClose().catch(() => undefined));
}

/** A `slotbroker fylr` child process. */
export interface FylrProcess {
  readonly id: string;
  /** "http://127.0.0.1:PORT" ("https://" with tls). */
  readonly url: string;
  readonly child: ChildProcess;
  readonly client: QueueClient;
  /** What it wrote to stderr (logs), for failure messages. */
  stderr(): string;
  /** Sends `signal` and waits for the exit; resolves with the exit code (null after a signal kill). */
  stop(signal?: NodeJS.Signals): Promise<number | null>;
}

/**
 * Starts `slotbroker fylr --config FILE` with `input` written as YAML; waits for its banner.
 * `client` talks to it with `credentials`.
 */
export async function spawnFylr(
  input: FylrConfigInput,
  name = "fylr",
  options: { credentials?: ApiCredentials; logLevel?: string; env?: NodeJS.ProcessEnv } = {},
): Promise<FylrProcess> {
  const dir = mkdtempSync(join(tmpdir(), "slotbroker-fylr-"));
  const configPath = join(dir, "fylr.yaml");
  writeFileSync(configPath, stringify({ name, ...input }));
  const child = spawn(process.execPath, slotbrokerArgs(["fylr", "--config", configPath]), {
    cwd: root,
    stdio: ["ignore", "pipe", "pipe"],
    env: { ...process.env, SLOTBROKER_LOG_LEVEL: options.logLevel ?? process.env.SLOTBROKER_FYLR_LOG_LEVEL ?? "warn", ...options.env },
  });
  let log = "";
  child.stderr.setEncoding("utf8").on("data", (chunk: string) => {
    log = (log + chunk).slice(-50_000);
  });
  const exited = new Promise<number | null>((done) => child.once("exit", (code) => done(code)));
  const stop = async (signal: NodeJS.Signals = "SIGTERM"): Promise<number | null> => {
    if (child.exitCode === null && child.signalCode === null) child.kill(signal);
    return exited;
  };
  // Tracked from the start, so a fylr that never printed its banner is still killed.
  const handle = { child, stderr: () => log, stop } as { -readonly [K in keyof FylrProcess]: FylrProcess[K] };
  track(handle, `fylr process ${name}`, async () => {
    await stop("SIGKILL");
    rmSync(dir, { recursive: true, force: true });
  });
  const [, id, address] = await waitForLine(child, /^fylr (\S+) listening http=(\S+)$/m, 30_000, () => log);
  handle.id = id!;
  handle.url = `${input.tls ? "https" : "http"}://${address}`;
  handle.client = createQueueClient(handle.url, options.credentials);
  return handle;
}

/** Waits for the child's stdout to match `pattern`; fails (with its stderr) when it exits first. */
export function waitForLine(child: ChildProcess, pattern: RegExp, timeoutMs: number, log: () => string): Promise<RegExpExecArray> {
  return waitForOutput(child, pattern, { timeoutMs, context: log });
}

/** A pg pool, tracked. */
export function openPool(url: string, max = 4): pg.Pool {
  const pool = createPgPool({ connectionString: url, max });
  pool.on("error", () => undefined);
  return track(pool, `pg pool ${max}`, (p) => p.end());
}

/** Releases tracked resources in order. */
export async function closeAll(...resources: (object | undefined)[]): Promise<void> {
  for (const r of resources) await release(r);
}

/** Runs a command to its end; resolves with its exit code and output. */
export function runCommand(
  argv: readonly string[],
  options: { env?: NodeJS.ProcessEnv; input?: string | Buffer; timeoutMs?: number } = {},
): Promise<{ code: number | null; stdout: Buffer; stderr: string }> {
  return new Promise((resolvePromise, reject) => {
    const [command, ...args] = argv;
    const child = spawn(command!, args, { cwd: root, env: { ...process.env, ...options.env }, stdio: ["pipe", "pipe", "pipe"] });
    const stdout: Buffer[] = [];
    let stderr = "";
    child.stdout.on("data", (b: Buffer) => stdout.push(b));
    child.stderr.setEncoding("utf8").on("data", (s: string) => (stderr += s));
    const timer = setTimeout(() => child.kill("SIGKILL"), options.timeoutMs ?? 60_000);
    child.once("error", reject);
    child.once("close", (code) => {
      clearTimeout(timer);
      resolvePromise({ code, stdout: Buffer.concat(stdout), stderr });
    });
    child.stdin.end(options.input ?? "");
  });
}

/** `slotbroker ARGS…` as a child process (compiled when the run built its children). */
export function slotbroker(args: readonly string[], options: Parameters<typeof runCommand>[1] = {}): ReturnType<typeof runCommand> {
  return runCommand([process.execPath, ...slotbrokerArgs(args)], options);
}
