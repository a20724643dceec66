import http from "node:http";
import https from "node:https";

/** Starts an HTTP(S) request to a pipe URL: no keep-alive agent, since each pipe is used once. */
export function pipeRequest(url: URL, options: http.RequestOptions, onResponse: (res: http.IncomingMessage) => void): http.ClientRequest {
  const send = url.protocol === "https:" ? https.request : http.request;
  return send(url, { ...options, agent: false }, onResponse);
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
