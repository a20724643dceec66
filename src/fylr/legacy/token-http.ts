import http from "node:http";
import https from "node:https";
import { isIP } from "node:net";
import type { Readable, Writable } from "node:stream";
import { pipeline } from "node:stream/promises";
import { create, toJsonString } from "@bufbuild/protobuf";
import { JobSpecSchema, type Receipt } from "../../../gen/slotbroker/v1/broker_pb.js";
import { Code, SlotbrokerError } from "../../shared/errors.js";
import {
  decodeReceiptHeader,
  JOB_PARAM,
  RECEIPT_HEADER,
  TOKEN_PARAM,
  type LegacyErrorBody,
  type TokenGrant,
} from "../../shared/legacy-protocol.js";
import { durationFromMs } from "@bufbuild/protobuf/wkt";

// The client half of the pre-broker token protocol: one GET /token, one PUT /job, one
// DELETE /job. Every request opens its own connection (no keep-alive), as the old fylrs
// did after their "Connection: close" re-balancing: behind a load balancer the PUT can
// therefore land on another replica than the GET, which answers "token not found".

/** How to reach one execserver's token protocol. */
export interface TokenEndpoint {
  /** Base URL, e.g. http://10.0.0.5:7601 (paths are appended). */
  readonly url: URL;
  /** Bearer token, when the execserver has one. */
  readonly token?: string;
  /** Trusted CA for https, PEM. */
  readonly ca?: Buffer;
  /** Client certificate chain and key for https (mutual TLS), PEM. */
  readonly cert?: Buffer;
  readonly key?: Buffer;
}

/** The TLS options of an https request to `url` (CA, client certificate); SNI only for a host name, as RFC 6066 wants. */
export function endpointTls(url: URL, tls: Pick<TokenEndpoint, "ca" | "cert" | "key">): https.RequestOptions {
  return {
    ...(tls.ca ? { ca: tls.ca } : {}),
    ...(tls.cert && tls.key ? { cert: tls.cert, key: tls.key } : {}),
    ...(isIP(url.hostname.replace(/^\[|\]$/g, "")) ? { servername: "" } : {}),
  };
}

/** The answer to GET /token/{service}. */
export type TokenAnswer =
  | { readonly kind: "token"; readonly grant: TokenGrant }
  /** 503: no free slot, wants parked, or draining; poll again later. */
  | { readonly kind: "busy"; readonly reason: string; readonly message: string }
  /** 404: the execserver does not offer the service. */
  | { readonly kind: "unknown-service"; readonly message: string };

/** The job of a PUT /job, as the old transport carried it (JSON in the query). */
export interface LegacyJob {
  readonly args?: readonly string[];
  readonly env?: Readonly<Record<string, string>>;
  readonly timeoutMs?: number;
  readonly labels?: Readonly<Record<string, string>>;
}

/** The PUT /job reached an instance that does not hold the token (the old incident class). */
export class TokenNotFoundError extends SlotbrokerError {
  override name = "TokenNotFoundError";
  constructor(url: URL, message: string) {
    super(Code.FailedPrecondition, `PUT ${url.origin}/job: ${message}`, { details: { url: url.origin } });
  }
}

/** GET /token/{service}: a token, busy, or unknown service; transport failures reject. */
export async function requestToken(endpoint: TokenEndpoint, service: string, signal?: AbortSignal): Promise<TokenAnswer> {
  const url = new URL(`token/${encodeURIComponent(service)}`, withSlash(endpoint.url));
  const res = await send(endpoint, "GET", url, undefined, signal);
  const body = await readAll(res);
  if (res.statusCode === 200) return { kind: "token", grant: parseJson<TokenGrant>(url, body) };
  const error = errorBody(body);
  if (res.statusCode === 503) return { kind: "busy", reason: error.reason, message: error.error };
  if (res.statusCode === 404) return { kind: "unknown-service", message: error.error };
  throw httpError("GET", url, res.statusCode, error);
}

/** DELETE /job?token=…: gives an unused token's slot back; false when the instance did not know it. */
export async function releaseToken(endpoint: TokenEndpoint, token: string, signal?: AbortSignal): Promise<boolean> {
  const url = jobUrl(endpoint, token);
  const res = await send(endpoint, "DELETE", url, undefined, signal);
  const body = await readAll(res);
  if (res.statusCode === 204) return true;
  if (res.statusCode === 404) return false;
  throw httpError("DELETE", url, res.statusCode, errorBody(body));
}

/**
 * PUT /job?token=…&job=…: runs the job with `stdin` as the request body and writes the
 * response body (its stdout) into `stdout`, which is ended after the last byte. Resolves
 * with the receipt from the header (output that fit the buffer) or the trailer (streamed
 * output). Rejects with TokenNotFoundError, or a DATA_LOSS error when the response broke
 * off (the job failed after its output passed 4000 bytes, or the connection dropped);
 * `stdout` is then destroyed with that error.
 */
export async function runWithToken(
  endpoint: TokenEndpoint,
  token: string,
  job: LegacyJob,
  stdin: Readable | Uint8Array | undefined,
  stdout: Writable,
  signal?: AbortSignal,
): Promise<Receipt> {
  const url = jobUrl(endpoint, token);
  url.searchParams.set(JOB_PARAM, jobJson(job));
  const res = await send(endpoint, "PUT", url, stdin ?? new Uint8Array(0), signal);
  if (res.statusCode !== 200) {
    const error = errorBody(await readAll(res));
    if (error.reason === "token-not-found") throw new TokenNotFoundError(url, error.error);
    throw httpError("PUT", url, res.statusCode, error);
  }
  let bytes = 0;
  res.on("data", (chunk: Buffer) => (bytes += chunk.length));
  try {
    await pipeline(res, stdout);
  } catch (err) {
    const broke = new SlotbrokerError(
      Code.DataLoss,
      `PUT ${url.origin}/job: the response broke off after ${bytes} bytes (the job failed after its output passed 4000 bytes, or the connection dropped)`,
      { cause: err },
    );
    if (!stdout.destroyed) stdout.destroy(broke);
    throw broke;
  }
  const value = (res.headers[RECEIPT_HEADER] as string | undefined) ?? res.trailers[RECEIPT_HEADER];
  if (!res.complete || value === undefined) {
    throw new SlotbrokerError(Code.DataLoss, `PUT ${url.origin}/job: the response carried no ${RECEIPT_HEADER} header or trailer`);
  }
  const receipt = decodeReceiptHeader(value);
  if (BigInt(bytes) !== receipt.stdoutBytes) {
    throw new SlotbrokerError(Code.DataLoss, `PUT ${url.origin}/job: the body had ${bytes} bytes, the receipt says ${receipt.stdoutBytes}`);
  }
  return receipt;
}

/** The job's JSON, as a JobSpec in its JSON form. */
export function jobJson(job: LegacyJob): string {
  const spec = create(JobSpecSchema, {
    args: [...(job.args ?? [])],
    env: { ...job.env },
    labels: { ...job.labels },
    timeout: job.timeoutMs === undefined ? undefined : durationFromMs(Math.round(job.timeoutMs)),
  });
  return toJsonString(JobSpecSchema, spec);
}

function jobUrl(endpoint: TokenEndpoint, token: string): URL {
  const url = new URL("job", withSlash(endpoint.url));
  url.searchParams.set(TOKEN_PARAM, token);
  return url;
}

function withSlash(url: URL): URL {
  return url.pathname.endsWith("/") ? url : new URL(`${url.href}/`);
}

function send(
  endpoint: TokenEndpoint,
  method: string,
  url: URL,
  body: Readable | Uint8Array | undefined,
  signal: AbortSignal | undefined,
): Promise<http.IncomingMessage> {
  return new Promise((resolve, reject) => {
    const headers: http.OutgoingHttpHeaders = {};
    if (endpoint.token) headers.authorization = `Bearer ${endpoint.token}`;
    const options: https.RequestOptions = { method, headers, agent: false, signal, ...endpointTls(url, endpoint) };
    const req = (url.protocol === "https:" ? https.request : http.request)(url, options, resolve);
    req.on("error", (err) => reject(transportError(method, url, err, signal)));
    if (body === undefined) req.end();
    else if (body instanceof Uint8Array) req.end(body);
    else {
      // A failing stdin source aborts the request; the server then stops the job.
      body.on("error", (err) => req.destroy(err));
      body.pipe(req);
    }
  });
}

function readAll(res: http.IncomingMessage): Promise<string> {
  return new Promise((resolve, reject) => {
    let text = "";
    res.setEncoding("utf8");
    res.on("data", (chunk: string) => {
      if (text.length < 64 * 1024) text += chunk;
    });
    res.on("end", () => resolve(text));
    res.on("error", reject);
  });
}

function parseJson<T>(url: URL, body: string): T {
  try {
    return JSON.parse(body) as T;
  } catch {
    throw new SlotbrokerError(Code.DataLoss, `${url.origin}${url.pathname}: not JSON: ${body.slice(0, 200)}`);
  }
}

function errorBody(body: string): LegacyErrorBody {
  try {
    const parsed = JSON.parse(body) as Partial<LegacyErrorBody>;
    return { error: String(parsed.error ?? body.trim()), reason: String(parsed.reason ?? "") };
  } catch {
    return { error: body.trim().slice(0, 500), reason: "" };
  }
}

function httpError(method: string, url: URL, status: number | undefined, error: LegacyErrorBody): SlotbrokerError {
  const code = status === 401 ? Code.Unauthenticated : status === 400 ? Code.InvalidArgument : Code.Unavailable;
  return new SlotbrokerError(code, `${method} ${url.origin}${url.pathname}: HTTP ${status}: ${error.error}`, { details: { status, reason: error.reason } });
}

function transportError(method: string, url: URL, err: Error, signal: AbortSignal | undefined): Error {
  if (signal?.aborted) return signal.reason as Error;
  return new SlotbrokerError(Code.Unavailable, `${method} ${url.origin}${url.pathname}: ${err.message}`, { cause: err });
}
