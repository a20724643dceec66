import { readFileSync } from "node:fs";
import http from "node:http";
import https from "node:https";
import { ConfigError } from "../../shared/errors.js";

/** Reads the execserver's pipes.caFile; a file that cannot be read is a ConfigError naming the key. */
export function readPipeCa(path: string): Buffer {
  try {
    return readFileSync(path);
  } catch (err) {
    throw new ConfigError(`pipes.caFile: cannot read ${path}: ${(err as Error).message}`, { cause: err });
  }
}

/**
 * Starts an HTTP(S) request to a pipe URL: no keep-alive agent, since each pipe is used
 * once. `ca` (the execserver's pipes.caFile) is trusted for https instead of the system's CAs.
 */
export function pipeRequest(url: URL, options: http.RequestOptions, onResponse: (res: http.IncomingMessage) => void, ca?: Buffer): http.ClientRequest {
  if (url.protocol === "https:") return https.request(url, { ...options, agent: false, ...(ca && { ca }) }, onResponse);
  return http.request(url, { ...options, agent: false }, onResponse);
}

/** True for a 2xx status. */
export function isSuccess(status: number | undefined): boolean {
  return status !== undefined && status >= 200 && status < 300;
}

/** A short description of a network error for a receipt: "ECONNREFUSED (connect …)". */
export function describeNetError(err: unknown): string {
  if (!(err instanceof Error)) return String(err);
  const code = (err as { code?: unknown }).code;
  return typeof code === "string" && !err.message.includes(code) ? `${code} (${err.message})` : err.message;
}
