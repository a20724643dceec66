import type { ChildProcess } from "node:child_process";

/** Options for waitForOutput. */
export interface WaitForOutputOptions {
  /** Give up after this long. */
  readonly timeoutMs: number;
  /** Extra text for the error, e.g. the child's stderr so far. */
  readonly context?: () => string;
}

/**
 * Waits until the child's stdout (everything it printed so far) matches `pattern`, e.g. a
 * "listening" banner with the ports it chose. When the child exits first or the timeout
 * passes, the child is killed and the promise rejects with the tail of its output.
 */
export function waitForOutput(child: ChildProcess, pattern: RegExp, options: WaitForOutputOptions): Promise<RegExpExecArray> {
  const stdout = child.stdout;
  if (!stdout) return Promise.reject(new Error("waitForOutput needs the child's stdout piped"));
  return new Promise((resolve, reject) => {
    let out = "";
    const timer = setTimeout(() => fail(`no output matching ${pattern} within ${options.timeoutMs} ms`), options.timeoutMs);
    const onData = (chunk: string): void => {
      out += chunk;
      const m = pattern.exec(out);
      if (!m) return;
      cleanup();
      resolve(m);
    };
    const onExit = (code: number | null, signal: string | null): void => fail(`exited (${signal ?? code}) before it was ready`);
    const fail = (why: string): void => {
      cleanup();
      child.kill("SIGKILL");
      const context = options.context?.();
      reject(new Error(`${why}\nstdout: ${out.slice(-2_000)}${context ? `\nstderr: ${context.slice(-4_000)}` : ""}`));
    };
    const cleanup = (): void => {
      clearTimeout(timer);
      stdout.off("data", onData);
      child.off("exit", onExit);
    };
    stdout.setEncoding("utf8").on("data", onData);
    child.once("exit", onExit);
  });
}
