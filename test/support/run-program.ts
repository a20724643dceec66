// Running a program to its end with its output kept, for tests that drive stock tools
// (curl, openssl, grpcurl) and clients in other languages.
import { execFile } from "node:child_process";
import { promisify } from "node:util";
import { projectRoot } from "../../harness/node-children.js";

const execFileP = promisify(execFile);

/** What a finished command printed, and how it exited. */
export interface Run {
  readonly code: number;
  readonly stdout: string;
  readonly stderr: string;
}

/** Runs a program to its end without throwing on a non-zero exit; `input` is written to its stdin. */
export async function run(file: string, args: readonly string[], options: { cwd?: string; env?: NodeJS.ProcessEnv; timeoutMs?: number; input?: string } = {}): Promise<Run> {
  try {
    const pending = execFileP(file, args, {
      cwd: options.cwd ?? projectRoot,
      env: options.env ?? process.env,
      timeout: options.timeoutMs ?? 60_000,
      maxBuffer: 64 * 1024 * 1024,
    });
    // `input` goes to its stdin; without it stdin is closed at once (the program reads EOF).
    // A program may exit without reading it: that EPIPE is not the test's failure.
    pending.child.stdin?.on("error", () => undefined);
    pending.child.stdin?.end(options.input ?? "");
    const { stdout, stderr } = await pending;
    return { code: 0, stdout, stderr };
  } catch (err) {
    const e = err as { code?: number | string; stdout?: string; stderr?: string; message: string };
    return { code: typeof e.code === "number" ? e.code : 1, stdout: e.stdout ?? "", stderr: e.stderr ?? e.message };
  }
}
