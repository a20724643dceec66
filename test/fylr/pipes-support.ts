// Helpers shared by the pipe and HTTP server tests: a tracked server, curl as a child
// process, hashing sinks, random payloads, and waits on a pipe's or a sink's events.
import { expect } from "chai";
import { spawn } from "node:child_process";
import { once } from "node:events";
import { createHash, randomBytes } from "node:crypto";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Writable, type Readable } from "node:stream";
import { PipeError, PipeRegistry, startFylrHttpServer, type FylrHttpServer, type FylrHttpServerOptions } from "../../src/fylr/index.js";
import type { PipeHandle } from "../../src/fylr/pipes/index.js";
import { release, track } from "../../harness/resources.js";
import { requireTool } from "../../harness/system-tools.js";

/** sha256 hex of bytes. */
export function sha256(bytes: Uint8Array): string {
  return createHash("sha256").update(bytes).digest("hex");
}

/** A registry closed by the leak tracker if a test forgets it. */
export function trackedRegistry(ttlMs?: number): PipeRegistry {
  return track(new PipeRegistry({ ttlMs }), "pipe registry", (r) => r.close());
}

/** A fylr HTTP server on 127.0.0.1, port 0, tracked for leak checks. */
export async function trackedServer(options: Omit<FylrHttpServerOptions, "listen"> = {}): Promise<FylrHttpServer> {
  const server = await startFylrHttpServer({ listen: "127.0.0.1:0", closeTimeoutMs: 2000, ...options });
  return track(server, "fylr http server", (s) => s.close());
}

/** Closes what trackedServer/trackedRegistry made. */
export async function releaseAll(...resources: (object | undefined)[]): Promise<void> {
  for (const r of resources) await release(r);
}

/** A sink that hashes what it receives instead of keeping it. */
export class HashingSink extends Writable {
  private readonly hash = createHash("sha256");
  bytes = 0;
  failure: Error | undefined;

  constructor(options: { highWaterMark?: number } = {}) {
    super({ highWaterMark: options.highWaterMark });
    this.on("error", (err) => {
      this.failure = err;
    });
  }

  override _write(chunk: Buffer, _enc: BufferEncoding, callback: (error?: Error | null) => void): void {
    this.hash.update(chunk);
    this.bytes += chunk.length;
    this.emit("bytes", this.bytes);
    callback();
  }

  /** The hex digest; call once after the sink finished. */
  digest(): string {
    return this.hash.digest("hex");
  }
}

/** Result of one curl run. */
export interface CurlResult {
  code: number | null;
  stdout: Buffer;
  stderr: string;
}

/** Runs curl with `args`; `stdin` is piped in when given. */
export function curl(args: string[], stdin?: Readable | Uint8Array): Promise<CurlResult> {
  const child = track(spawn(requireTool("curl"), ["-sS", ...args], { stdio: ["pipe", "pipe", "pipe"] }), "curl", (c) => {
    c.kill("SIGKILL");
  });
  const out: Buffer[] = [];
  let stderr = "";
  child.stdout.on("data", (d: Buffer) => out.push(d));
  child.stderr.on("data", (d: Buffer) => (stderr += d.toString()));
  child.stdin.on("error", () => undefined);
  if (stdin instanceof Uint8Array) child.stdin.end(stdin);
  else if (stdin) stdin.pipe(child.stdin);
  else child.stdin.end();
  return new Promise((resolve, reject) => {
    child.once("error", reject);
    child.once("close", (code) => {
      void release(child);
      resolve({ code, stdout: Buffer.concat(out), stderr });
    });
  });
}

/** Splits curl's `-w '\n%{http_code}'` trailer off the body. */
export function statusAndBody(result: CurlResult): { status: number; body: string } {
  const text = result.stdout.toString("utf8");
  const cut = text.lastIndexOf("\n");
  return { status: Number(text.slice(cut + 1)), body: text.slice(0, cut) };
}

/** A temporary directory, removed by the leak tracker's close. */
export function tempDir(): { path: string; file(name: string, bytes: Uint8Array): string } {
  const path = mkdtempSync(join(tmpdir(), "slotbroker-pipes-"));
  const dir = {
    path,
    file(name: string, bytes: Uint8Array): string {
      const file = join(path, name);
      writeFileSync(file, bytes);
      return file;
    },
  };
  return track(dir, "temp dir", () => rmSync(path, { recursive: true, force: true }));
}

/** `n` random bytes. */
export function randomPayload(n: number): Buffer {
  return randomBytes(n);
}

/** Awaits a promise that must fail with a PipeError; returns the error. */
export async function pipeFailure(promise: Promise<unknown>): Promise<PipeError> {
  try {
    await promise;
  } catch (err) {
    expect(err).to.be.instanceOf(PipeError);
    return err as PipeError;
  }
  throw new Error("expected the pipe to fail");
}

/** Resolves once the pipe's consumer arrived (state "streaming"); rejects if it settled without. */
export async function streaming(pipe: PipeHandle): Promise<void> {
  if (pipe.state === "streaming") return;
  if (pipe.state !== "waiting") throw new Error(`the pipe is ${pipe.state}, it never streamed`);
  const [state] = await pipe.events.next("state");
  if (state !== "streaming") throw new Error(`the pipe went ${state}, it never streamed`);
}

/** Resolves once the sink was handed its first bytes. */
export async function sinkGotBytes(sink: HashingSink): Promise<void> {
  if (sink.bytes === 0) await once(sink, "bytes");
}
