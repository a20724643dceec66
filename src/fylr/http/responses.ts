import type { OutgoingHttpHeaders } from "node:http";
import { Code, SlotbrokerError } from "../../shared/errors.js";
import { drained } from "../../shared/streams.js";
import type { HttpRequest, HttpResponse } from "./http-types.js";

/** Answers with a one-line plain-text reason (unless the response already started). */
export function sendText(res: HttpResponse, status: number, text: string, extraHeaders: OutgoingHttpHeaders = {}): void {
  sendBody(res, status, "text/plain; charset=utf-8", `${text.replace(/[\r\n]+/g, " ")}\n`, extraHeaders);
}

/** Answers with a JSON body (unless the response already started), e.g. a Connect error. */
export function sendJson(res: HttpResponse, status: number, value: unknown, extraHeaders: OutgoingHttpHeaders = {}): void {
  sendBody(res, status, "application/json", JSON.stringify(value), extraHeaders);
}

function sendBody(res: HttpResponse, status: number, contentType: string, body: string, extraHeaders: OutgoingHttpHeaders): void {
  if (res.headersSent || isGone(res)) return;
  const headers = { ...extraHeaders };
  // Connection-specific headers are illegal in HTTP/2 (Node throws on them).
  if ("stream" in res) delete headers.connection;
  writeHead(res, status, { "content-type": contentType, "content-length": Buffer.byteLength(body), "cache-control": "no-store", ...headers });
  res.end(body);
}

/** `res.writeHead` for either protocol (their overloads do not unify in TypeScript). */
export function writeHead(res: HttpResponse, status: number, headers: OutgoingHttpHeaders): void {
  (res as { writeHead(status: number, headers: OutgoingHttpHeaders): unknown }).writeHead(status, headers);
}

/** True once the response's connection or stream is gone. */
export function isGone(res: HttpResponse): boolean {
  return res.destroyed || ("stream" in res && res.stream.destroyed);
}

/**
 * Writes one chunk and resolves when the response can take more; rejects when the
 * peer went away first, so a stalled reader never pins the producer.
 */
export function writeChunk(res: HttpResponse, chunk: Uint8Array): Promise<void> {
  if (isGone(res)) return Promise.reject(new Error("the client went away"));
  if ((res as { write(chunk: Uint8Array): boolean }).write(chunk)) return Promise.resolve();
  return drained(res, () => new Error("the client went away"));
}

/**
 * Ends the response; resolves once it is flushed, rejects when the peer went away first.
 * `onFlushed` runs synchronously at that moment, before the 'close' that follows it.
 */
export function endResponse(res: HttpResponse, onFlushed: () => void = () => undefined): Promise<void> {
  return new Promise((resolve, reject) => {
    if (isGone(res)) return reject(new Error("the client went away"));
    const onClose = (): void => reject(new Error("the client went away"));
    res.once("close", onClose);
    res.end(() => {
      res.off("close", onClose);
      onFlushed();
      resolve();
    });
  });
}

/**
 * Kills a response mid-body so the peer sees a broken transfer, never a short success:
 * HTTP/1.1 drops the connection, HTTP/2 resets the stream.
 */
export function abortResponse(res: HttpResponse, err: Error): void {
  if ("stream" in res) res.stream.close(2 /* NGHTTP2_INTERNAL_ERROR */);
  else res.destroy(err);
}

/**
 * True when the request body arrived complete. HTTP/1.1 marks `complete` only after the
 * final chunk or Content-Length; Node's HTTP/2 compatibility layer ends the body stream
 * cleanly even when the client resets it, so there a closed or aborted stream means cut.
 */
export function requestBodyIntact(req: HttpRequest): boolean {
  if ("stream" in req) return !req.aborted && !req.stream.closed && !req.stream.destroyed;
  return req.complete && !req.readableAborted;
}

// The one place that turns a typed error into an HTTP status for the raw routes.
const statusByCode: Partial<Record<Code, number>> = {
  [Code.NotFound]: 404,
  [Code.FailedPrecondition]: 410,
  [Code.InvalidArgument]: 400,
  [Code.AlreadyExists]: 409,
  [Code.Unavailable]: 503,
  [Code.Aborted]: 500,
  [Code.Canceled]: 499,
};

/** HTTP status for an error on a raw route (404 unknown, 410 gone, 503 closed, …). */
export function httpStatusFor(err: unknown): number {
  return statusByCode[SlotbrokerError.from(err, Code.Internal).code] ?? 500;
}
