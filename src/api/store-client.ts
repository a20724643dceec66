/**
 * The client side of the store's HTTP routes, for the CLI and tests: stream an input of
 * any size to `POST /queue/inputs`, stream an item's output from
 * `GET /queue/items/{id}/output` into a Writable while hashing it. Plain node:http, so
 * memory stays flat however large the bytes are.
 */
import { createHash } from "node:crypto";
import * as http from "node:http";
import * as https from "node:https";
import type { Readable, Writable } from "node:stream";
import { pipeline } from "node:stream/promises";
import { Transform } from "node:stream";
import { Code, SlotbrokerError } from "../shared/errors.js";
import { authorizationHeaders, tlsOptions, type ApiCredentials } from "./client.js";

/** What the fylr answers for a stored upload. */
export interface StoredUpload {
  readonly id: string;
  readonly size: number;
  readonly sha256: string;
  readonly expiresAt: string;
}

function request(url: URL, options: http.RequestOptions, credentials: ApiCredentials): http.ClientRequest {
  const headers = { ...(options.headers as http.OutgoingHttpHeaders), ...authorizationHeaders(credentials) };
  if (url.protocol === "https:") return https.request(url, { ...options, headers, ...tlsOptions(credentials) });
  return http.request(url, { ...options, headers });
}

async function failure(res: http.IncomingMessage, what: string): Promise<SlotbrokerError> {
  let text = "";
  for await (const chunk of res as AsyncIterable<Buffer>) if (text.length < 2000) text += chunk.toString("utf8");
  const code = statusCodes[res.statusCode ?? 0] ?? Code.FailedPrecondition;
  return new SlotbrokerError(code, `${what}: HTTP ${res.statusCode}: ${text.trim() || res.statusMessage}`);
}

const statusCodes: Record<number, Code> = {
  401: Code.Unauthenticated,
  403: Code.PermissionDenied,
  404: Code.NotFound,
  413: Code.ResourceExhausted,
  507: Code.ResourceExhausted,
};

/** Streams `source` to the fylr at `baseUrl` as one upload; `size` (when known) lets the fylr refuse early. */
export function uploadInput(
  baseUrl: string,
  source: Readable,
  options: { size?: number; signal?: AbortSignal; credentials?: ApiCredentials } = {},
): Promise<StoredUpload> {
  const url = new URL("/queue/inputs", baseUrl);
  return new Promise((resolve, reject) => {
    const headers: http.OutgoingHttpHeaders = { "content-type": "application/octet-stream" };
    if (options.size !== undefined) headers["content-length"] = options.size;
    const req = request(url, { method: "POST", headers, signal: options.signal }, options.credentials ?? {});
    req.on("response", (res) => {
      if (res.statusCode !== 201) {
        source.destroy();
        failure(res, "upload").then(reject, reject);
        return;
      }
      let body = "";
      res.setEncoding("utf8").on("data", (chunk: string) => (body += chunk));
      res.on("end", () => {
        try {
          resolve(JSON.parse(body) as StoredUpload);
        } catch (err) {
          reject(err instanceof Error ? err : new Error(String(err)));
        }
      });
    });
    req.on("error", reject);
    // A refused upload answers before the body is sent: that answer is the error to show.
    pipeline(source, req).catch(() => undefined);
  });
}

/** Streams item `id`'s output into `target` and returns its size and SHA-256 as received. */
export function downloadOutput(
  baseUrl: string,
  id: string,
  target: Writable,
  /** `end: false` leaves `target` open (standard output). */
  options: { signal?: AbortSignal; range?: string; end?: boolean; credentials?: ApiCredentials } = {},
): Promise<{ size: number; sha256: string; expectedSha256: string | undefined }> {
  const url = new URL(`/queue/items/${encodeURIComponent(id)}/output`, baseUrl);
  return new Promise((resolve, reject) => {
    const req = request(url, { method: "GET", signal: options.signal, headers: options.range ? { range: options.range } : {} }, options.credentials ?? {});
    req.on("error", reject);
    req.on("response", (res) => {
      if (res.statusCode !== 200 && res.statusCode !== 206) {
        failure(res, `output of item ${id}`).then(reject, reject);
        return;
      }
      const etag = res.headers.etag?.replace(/"/g, "");
      const hash = createHash("sha256");
      let size = 0;
      const counter = new Transform({
        transform(chunk: Buffer, _enc, callback) {
          size += chunk.length;
          hash.update(chunk);
          callback(null, chunk);
        },
      });
      pipeline(res, counter, target, { end: options.end ?? true }).then(() => {
        if (!res.complete) return reject(new SlotbrokerError(Code.DataLoss, `output of item ${id}: the download was cut off after ${size} bytes`));
        resolve({ size, sha256: hash.digest("hex"), expectedSha256: etag || undefined });
      }, reject);
    });
    req.end();
  });
}
