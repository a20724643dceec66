/**
 * `slotbroker up` as a child process for tests: started with `--port-base 0`, its banner
 * read, tracked (the whole process tree is killed if a test leaves it running).
 */
import { spawn, type ChildProcess } from "node:child_process";
import { slotbrokerArgs } from "../../harness/node-children.js";
import { root, waitForLine } from "../integration/support.js";
import { track } from "../../harness/resources.js";

/** A running `slotbroker up`. */
export interface Up {
  readonly child: ChildProcess;
  readonly api: string;
  readonly grpc: string;
  readonly admin: string;
  /** The database URL the banner prints (the password masked when it came from DATABASE_URL). */
  readonly postgres: string;
  readonly banner: string;
  stderr(): string;
  /** Sends SIGTERM and waits; resolves with the exit code. */
  stop(): Promise<number | null>;
}

/** `slotbroker up --port-base 0 ARGS…`; `detached` makes it lead a process group, like a shell job. */
export async function startUp(env: NodeJS.ProcessEnv, detached = false, args: readonly string[] = []): Promise<Up> {
  const child = spawn(process.execPath, slotbrokerArgs(["up", "--port-base", "0", ...args]), { cwd: root, env, detached, stdio: ["ignore", "pipe", "pipe"] });
  let log = "";
  child.stderr.setEncoding("utf8").on("data", (s: string) => (log += s));
  const exited = new Promise<number | null>((done) => child.once("exit", (code) => done(code)));
  const stop = async (): Promise<number | null> => {
    if (child.exitCode === null && child.signalCode === null) child.kill("SIGTERM");
    return exited;
  };
  const handle = { child, stderr: () => log, stop } as { -readonly [K in keyof Up]: Up[K] };
  track(handle, "slotbroker up", async () => {
    for (const pid of await descendants(child.pid!)) killQuietly(pid);
    if (child.exitCode === null && child.signalCode === null) child.kill("SIGKILL");
  });
  const m = await waitForLine(child, /^[\s\S]*api=(\S+)[\s\S]*Ctrl-C/, 120_000, () => log);
  handle.banner = m[0];
  handle.api = /api=(\S+)/.exec(m[0])![1]!;
  handle.grpc = /grpc=(\S+)/.exec(m[0])![1]!;
  handle.admin = /admin=(\S+)/.exec(m[0])![1]!;
  handle.postgres = /^ +postgres +(\S+)/m.exec(m[0])![1]!;
  return handle;
}

/** Every process below `pid`, to check that nothing outlives `up`. */
export async function descendants(pid: number): Promise<number[]> {
  const { stdout } = await output(["pgrep", "-P", String(pid)]);
  const children = stdout.split("\n").filter(Boolean).map(Number);
  const below = await Promise.all(children.map(descendants));
  return [...children, ...below.flat()];
}

function killQuietly(pid: number): void {
  try {
    process.kill(pid, "SIGKILL");
  } catch {
    // gone already
  }
}

async function output(argv: string[]): Promise<{ stdout: string }> {
  return new Promise((resolve) => {
    const child = spawn(argv[0]!, argv.slice(1), { stdio: ["ignore", "pipe", "ignore"] });
    let stdout = "";
    child.stdout.setEncoding("utf8").on("data", (s: string) => (stdout += s));
    child.once("close", () => resolve({ stdout }));
  });
}
