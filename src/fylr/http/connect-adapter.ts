// Connect's Node adapter, with one correction: a request body that is not valid protobuf
// binary is the caller's error. The library reports it as INTERNAL ("parse binary: …",
// HTTP 500, since its codec cannot tell a request from a response); here it becomes
// INVALID_ARGUMENT naming the message, for the Connect protocol (unary: HTTP 400; streams:
// the end-of-stream error) and for gRPC (grpc-status 3).
import { Code, createConnectRouter, type ConnectRouter, type ConnectRouterOptions, type ContextValues } from "@connectrpc/connect";
import { compressionBrotli, compressionGzip, universalRequestFromNodeRequest, universalResponseToNodeResponse } from "@connectrpc/connect-node";
import { createAsyncIterable, type UniversalHandler, type UniversalServerResponse } from "@connectrpc/connect/protocol";
import type { Logger } from "../../shared/log.js";
import { DirectUnary } from "./connect-unary.js";
import type { HttpRequest, HttpResponse } from "./http-types.js";
import { grpcMessage } from "./introspection.js";

export interface ConnectAdapterOptions {
  readonly router: ConnectRouterOptions;
  readonly routes: (router: ConnectRouter) => void;
  readonly contextValues: (req: HttpRequest) => ContextValues;
  /** Answers a path no procedure serves. */
  readonly fallback: (req: HttpRequest, res: HttpResponse) => void;
  readonly logger: Logger;
}

/**
 * A request listener serving the routes' Connect, gRPC and gRPC-Web procedures. Plain
 * unary Connect calls over HTTP/1.1 take a direct path (connect-unary.ts).
 */
export function connectAdapter(options: ConnectAdapterOptions): (req: HttpRequest, res: HttpResponse) => void {
  const routerOptions: ConnectRouterOptions = { acceptCompression: [compressionGzip, compressionBrotli], ...options.router };
  const router = createConnectRouter(routerOptions);
  const direct = new DirectUnary(routerOptions);
  options.routes(direct.recording(router));
  const paths = new Map<string, UniversalHandler>();
  for (const handler of router.handlers) paths.set(handler.requestPath, withBadBodyAsInvalidArgument(handler));
  return (req, res) => {
    const path = (req.url ?? "").split("?", 1)[0]!;
    const handler = paths.get(path);
    if (!handler) return options.fallback(req, res);
    const failed = (err: unknown): void => {
      if ((err as { code?: unknown }).code === Code.Aborted) return;
      options.logger.error({ err: (err as Error).message, procedure: handler.requestPath }, "connect handler failed");
    };
    const respond = (answer: Promise<UniversalServerResponse>): void => {
      answer
        .then((uRes) => {
          // The rest of an oversize body is not read: an HTTP/1.1 connection ends after the 413
          // instead of draining it (HTTP/2 resets the stream by itself).
          if (uRes.status === 413 && !("stream" in res)) res.setHeader("connection", "close");
          return universalResponseToNodeResponse(uRes, res);
        })
        .catch(failed);
    };
    // `body`: what the direct path already read.
    const generic = (body?: Uint8Array | AsyncIterable<Uint8Array>): void => {
      const uReq = universalRequestFromNodeRequest(req, res, undefined, options.contextValues(req));
      if (!body) return respond(handler(uReq));
      respond(handler({ ...uReq, body: body instanceof Uint8Array ? createAsyncIterable([body]) : body }));
    };
    const inputType = handler.method.input.typeName;
    const answerError = (uRes: UniversalServerResponse): void => respond(Promise.resolve(correctBadBody(uRes, inputType)));
    if (direct.serve(path, req, res, () => options.contextValues(req), generic, answerError, failed)) return;
    generic();
  };
}

const PARSE_PREFIX = "parse binary: ";

/** What the caller is told instead of the library's "parse binary: …". */
export function badBodyMessage(inputType: string, libraryMessage: string): string {
  return `request body: not a valid ${inputType} in protobuf binary (${libraryMessage.slice(PARSE_PREFIX.length)})`;
}

function isBadBody(code: unknown, message: unknown): message is string {
  return code === "internal" && typeof message === "string" && message.startsWith(PARSE_PREFIX);
}

export function withBadBodyAsInvalidArgument(handler: UniversalHandler): UniversalHandler {
  const inputType = handler.method.input.typeName;
  const wrapped = async (req: Parameters<UniversalHandler>[0]): Promise<UniversalServerResponse> => correctBadBody(await handler(req), inputType);
  return Object.assign(wrapped, handler);
}

// Connect's words for a request message over readMaxBytes (protocol/limit-io.ts and the
// decompression check); it answers them RESOURCE_EXHAUSTED, which Connect maps to HTTP 429.
const OVER_LIMIT = /\bis larger than configured readMaxBytes (\d+)/;

/** What the caller is told instead of Connect's "message size … readMaxBytes N". */
export function tooLargeMessage(limit: string): string {
  return `request body: larger than the ${limit} bytes a request message may have here (http.maxRequestBytes)`;
}

/**
 * A response as the caller should see it: "parse binary: …" becomes INVALID_ARGUMENT, and a
 * unary request over the size limit is HTTP 413 (the code stays RESOURCE_EXHAUSTED: 429
 * would tell an HTTP client to retry the same body later).
 */
export function correctBadBody(res: UniversalServerResponse, inputType: string): UniversalServerResponse | Promise<UniversalServerResponse> {
  const contentType = res.header?.get("content-type") ?? "";
  if ((res.status === 500 || res.status === 429) && contentType.startsWith("application/json") && !res.header?.get("content-encoding")) return fixUnary(res, inputType);
  if (contentType.startsWith("application/connect+proto")) return { ...res, body: fixStreamEnd(res.body, inputType) };
  if (contentType.startsWith("application/grpc") && !contentType.startsWith("application/grpc-web")) return { ...res, body: fixGrpcTrailer(res, inputType) };
  return res;
}

async function fixUnary(res: UniversalServerResponse, inputType: string): Promise<UniversalServerResponse> {
  const chunks: Uint8Array[] = [];
  for await (const chunk of res.body ?? []) chunks.push(chunk);
  const bytes = Buffer.concat(chunks);
  const same = { ...res, body: createAsyncIterable([bytes]) };
  let error: { code?: unknown; message?: unknown };
  try {
    error = JSON.parse(bytes.toString("utf8")) as typeof error;
  } catch {
    return same;
  }
  const over = error.code === "resource_exhausted" && typeof error.message === "string" ? OVER_LIMIT.exec(error.message) : null;
  if (over) return answer(res, 413, { code: "resource_exhausted", message: tooLargeMessage(over[1]!) });
  if (!isBadBody(error.code, error.message)) return same;
  return answer(res, 400, { code: "invalid_argument", message: badBodyMessage(inputType, error.message) });
}

function answer(res: UniversalServerResponse, status: number, error: { code: string; message: string }): UniversalServerResponse {
  const body = Buffer.from(JSON.stringify(error));
  const header = new Headers(res.header);
  header.set("content-length", String(body.byteLength));
  return { ...res, status, header, body: createAsyncIterable([body]) };
}

// Each chunk of a Connect stream body is one envelope; flag 0x02 marks the end-of-stream
// JSON, which carries the error (an uncompressed one: flag 0x01 unset).
async function* fixStreamEnd(body: UniversalServerResponse["body"], inputType: string): AsyncIterable<Uint8Array> {
  for await (const chunk of body ?? []) {
    if (chunk.length < 5 || chunk[0] !== 0x02) {
      yield chunk;
      continue;
    }
    let end: { error?: { code?: unknown; message?: unknown } };
    try {
      end = JSON.parse(Buffer.from(chunk.subarray(5)).toString("utf8")) as typeof end;
    } catch {
      yield chunk;
      continue;
    }
    if (!end.error || !isBadBody(end.error.code, end.error.message)) {
      yield chunk;
      continue;
    }
    const json = Buffer.from(JSON.stringify({ ...end, error: { code: "invalid_argument", message: badBodyMessage(inputType, end.error.message) } }));
    const head = Buffer.alloc(5);
    head[0] = 0x02;
    head.writeUInt32BE(json.length, 1);
    yield Buffer.concat([head, json]);
  }
}

// gRPC carries the status in trailers, filled in while the body is produced.
async function* fixGrpcTrailer(res: UniversalServerResponse, inputType: string): AsyncIterable<Uint8Array> {
  if (res.body) yield* res.body;
  const trailer = res.trailer;
  if (!trailer || trailer.get("grpc-status") !== String(Code.Internal)) return;
  let message: string;
  try {
    message = decodeURIComponent(trailer.get("grpc-message") ?? "");
  } catch {
    return;
  }
  if (!isBadBody("internal", message)) return;
  trailer.set("grpc-status", String(Code.InvalidArgument));
  trailer.set("grpc-message", grpcMessage(badBodyMessage(inputType, message)));
}
