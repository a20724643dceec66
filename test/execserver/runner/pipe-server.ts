import { createHash } from "node:crypto";
import http from "node:http";
import type { AddressInfo } from "node:net";
import { release, track } from "../../../harness/resources.js";

/** What a PUT handler saw: a clean end of the body, or a body that broke off. */
export interface ReceivedUpload {
  readonly outcome: "complete" | "aborted";
  readonly bytes: number;
  readonly sha256: string;
  readonly head: Buffer;
}

/** How the test's pipe endpoints behave. */
export interface PipeServerOptions {
  /** GET /in answers this body (default empty) with this status (default 200). */
  readonly stdinBody?: Buffer;
  readonly stdinStatus?: number;
  /** GET /in sends this many bytes of a longer announced body, then drops the connection. */
  readonly stdinBreakAfter?: number;
  /** GET /in sends its headers at once and its body once this settles (a job can wait on its stdin for the test). */
  readonly stdinHold?: Promise<void>;
  /** PUT /out answers this status (default 200); a non-2xx is sent before reading the body. */
  readonly stdoutStatus?: number;
}

/** A real HTTP server on 127.0.0.1:0 playing the fylr's pipe endpoints. */
export interface PipeServer {
  readonly stdinUrl: string;
  readonly stdoutUrl: string;
  /** "METHOD /path" of every request received, in order. */
  readonly requests: string[];
  /** One promise per PUT /out, settled when its body ended or broke off. */
  readonly uploads: Promise<ReceivedUpload>[];
  /** Resolves once one PUT /out has received at least `bytes` bytes of body. */
  uploadReached(bytes: number): Promise<void>;
  close(): Promise<void>;
}

/** Starts pipe endpoints for one test; closed by `release` (or the leak check). */
export async function startPipeServer(options: PipeServerOptions = {}): Promise<PipeServer> {
  const requests: string[] = [];
  const uploads: Promise<ReceivedUpload>[] = [];
  // The most bytes any upload has received so far, and who waits for more.
  let uploaded = 0;
  const progress = new Set<() => void>();
  const server = http.createServer((req, res) => {
    requests.push(`${req.method} ${req.url}`);
    if (req.method === "GET" && req.url === "/in") return serveStdin(res, options);
    if (req.method === "PUT" && req.url === "/out") return void uploads.push(receiveUpload(req, res, options.stdoutStatus ?? 200, (n) => {
      uploaded = Math.max(uploaded, n);
      progress.forEach((check) => check());
    }));
    res.writeHead(404).end();
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const { port } = server.address() as AddressInfo;
  const close = async (): Promise<void> => {
    server.closeAllConnections();
    await new Promise<void>((resolve) => server.close(() => resolve()));
  };
  const pipes: PipeServer = {
    stdinUrl: `http://127.0.0.1:${port}/in`,
    stdoutUrl: `http://127.0.0.1:${port}/out`,
    requests,
    uploads,
    uploadReached: (bytes) =>
      new Promise((resolve) => {
        const check = (): void => void (uploaded >= bytes && (progress.delete(check), resolve()));
        progress.add(check);
        check();
      }),
    close: () => release(pipes),
  };
  return track(pipes, "pipe server", close);
}

function serveStdin(res: http.ServerResponse, options: PipeServerOptions): void {
  const body = options.stdinBody ?? Buffer.alloc(0);
  if (options.stdinBreakAfter !== undefined) {
    res.writeHead(200, { "content-length": String(body.length) });
    res.write(body.subarray(0, options.stdinBreakAfter), () => res.destroy());
    return;
  }
  res.writeHead(options.stdinStatus ?? 200, { "content-length": String(body.length) });
  if (!options.stdinHold) return void res.end(body);
  res.flushHeaders();
  void options.stdinHold.then(() => res.end(body));
}

function receiveUpload(req: http.IncomingMessage, res: http.ServerResponse, status: number, onBytes: (total: number) => void): Promise<ReceivedUpload> {
  if (status < 200 || status >= 300) res.writeHead(status).end();
  const hash = createHash("sha256");
  const head: Buffer[] = [];
  let bytes = 0;
  return new Promise((resolve) => {
    req.on("data", (chunk: Buffer) => {
      if (bytes < 8192) head.push(chunk.subarray(0, 8192 - bytes));
      bytes += chunk.length;
      hash.update(chunk);
      onBytes(bytes);
    });
    req.on("end", () => {
      if (!res.headersSent) res.writeHead(status).end();
    });
    req.on("error", () => {});
    req.on("close", () => {
      const outcome = req.complete ? "complete" : "aborted";
      resolve({ outcome, bytes, sha256: hash.digest("hex"), head: Buffer.concat(head) });
    });
  });
}
