// The common Connect call — unary, POST over HTTP/1.1, an uncompressed application/proto
// or application/json body with a Content-Length, no timeout header — answered directly:
// read the body, parse, call the implementation, write the answer. Connect's generic
// handler does the same through web Headers, async iterables and three AbortControllers
// per call (two of them aborted with a fresh DOMException each); for a Submit that was
// most of the fylr's own CPU per request. Anything else (gRPC, gRPC-Web, streams, GET,
// compressed or chunked bodies, a body that does not parse) goes the generic way, with the
// bytes already read, so every error answer stays Connect's own.
import { create, type DescMessage, type DescMethod, type DescService } from "@bufbuild/protobuf";
import {
  Code,
  ConnectError,
  createMethodImplSpec,
  createServiceImplSpec,
  type ConnectRouter,
  type ContextValues,
  type HandlerContext,
  type MethodImplSpec,
} from "@connectrpc/connect";
import {
  compressionNegotiate,
  createAsyncIterable,
  createMethodSerializationLookup,
  validateUniversalHandlerOptions,
  type MethodSerializationLookup,
  type UniversalHandlerOptions,
  type UniversalServerResponse,
} from "@connectrpc/connect/protocol";
import { codeToHttpStatus, contentTypeUnaryJson, contentTypeUnaryProto, errorToJsonBytes, trailerMux } from "@connectrpc/connect/protocol-connect";
import type { OutgoingHttpHeaders } from "node:http";
import { binaryAnswer, binaryRequests, type BinaryAnswer, type BinaryRequests } from "../../shared/protobuf-wire.js";
import type { HttpRequest, HttpResponse } from "./http-types.js";
import { writeHead } from "./responses.js";

type ValidatedOptions = ReturnType<typeof validateUniversalHandlerOptions>;

/** One unary procedure the direct path serves. */
interface UnaryProcedure {
  readonly spec: Extract<MethodImplSpec, { kind: "unary" }>;
  readonly serialization: MethodSerializationLookup<DescMessage, DescMessage>;
  /** The implementation's own decoder of binary requests (undefined answers: protobuf-es). */
  readonly decode: ((bytes: Uint8Array) => unknown) | undefined;
}

/** Answers, the generic way, a call the direct path took but cannot answer: its body as read. */
export type UnaryFallback = (body: Uint8Array | AsyncIterable<Uint8Array>) => void;

/** Writes an error answer (built like Connect's) the generic way. */
export type ErrorWriter = (response: UniversalServerResponse) => void;

/** Hears about a call that failed past the point of answering (e.g. a write that threw). */
export type FailureReporter = (err: unknown) => void;

/**
 * Wraps `router` so that unary procedures registered through it (without per-service
 * options) are also served directly; `serve` answers a request when it can.
 */
export class DirectUnary {
  private readonly procedures = new Map<string, UnaryProcedure>();
  private readonly options: ValidatedOptions;
  private readonly enabled: boolean;

  constructor(routerOptions: Partial<UniversalHandlerOptions>) {
    this.options = validateUniversalHandlerOptions(routerOptions);
    // Interceptors and a shutdown signal change what a call sees: those keep the generic path.
    this.enabled = this.options.interceptors.length === 0 && !this.options.shutdownSignal && !this.options.requireConnectProtocolHeader;
  }

  /** A router that registers on `router` and remembers the unary procedures. */
  recording(router: ConnectRouter): ConnectRouter {
    const record = (spec: MethodImplSpec, decoders?: BinaryRequests[typeof binaryRequests]): void => {
      if (spec.kind !== "unary") return;
      const o = this.options;
      const serialization = createMethodSerializationLookup(spec.method, o.binaryOptions, o.jsonOptions, o);
      this.procedures.set(`/${spec.method.parent.typeName}/${spec.method.name}`, { spec, serialization, decode: decoders?.[spec.method.localName] });
    };
    const recording: ConnectRouter = {
      get handlers() {
        return router.handlers;
      },
      service: (service, implementation, options) => {
        router.service(service, implementation, options);
        const decoders = (implementation as BinaryRequests)[binaryRequests];
        if (!options) for (const spec of Object.values(createServiceImplSpec(service, implementation).methods)) record(spec, decoders);
        return recording;
      },
      rpc: (method, impl, options) => {
        router.rpc(method, impl, options);
        if (!options) record(createMethodImplSpec(method, impl));
        return recording;
      },
    };
    return recording;
  }

  /**
   * Serves `req` directly and returns true, or returns false without touching it. Once
   * taken, a body that does not parse is handed to `fallback`; an error answer to `error`.
   */
  serve(path: string, req: HttpRequest, res: HttpResponse, values: () => ContextValues, fallback: UnaryFallback, error: ErrorWriter, failed: FailureReporter): boolean {
    if (!this.enabled || req.method !== "POST" || "stream" in req) return false;
    const procedure = this.procedures.get(path);
    if (!procedure) return false;
    const headers = req.headers;
    const contentType = headers["content-type"];
    const binary = contentType === contentTypeUnaryProto;
    if (!binary && contentType !== contentTypeUnaryJson) return false;
    if (headers["content-encoding"] !== undefined || headers["connect-timeout-ms"] !== undefined) return false;
    // A body without Content-Length (chunked) is read up to the limit; past it, or when its
    // length differs from the header, Connect reads the same bytes and answers as it does.
    const lengthHeader = headers["content-length"];
    if (lengthHeader !== undefined && !/^\d{1,10}$/.test(lengthHeader)) return false;
    const length = lengthHeader === undefined ? undefined : Number(lengthHeader);
    const limit = this.options.readMaxBytes;
    if (length !== undefined && length > limit) return false;
    readBody(req, limit, fallback, (bytes) => {
      if (length !== undefined && bytes.byteLength !== length) return fallback(bytes);
      let input;
      try {
        input = (binary ? procedure.decode?.(bytes) : undefined) ?? procedure.serialization.getI(binary).parse(bytes);
      } catch {
        return fallback(bytes);
      }
      this.call(procedure, input, binary, req, res, values, error).catch(failed);
    });
    return true;
  }

  private async call(
    procedure: UnaryProcedure,
    input: unknown,
    binary: boolean,
    req: HttpRequest,
    res: HttpResponse,
    values: () => ContextValues,
    error: ErrorWriter,
  ): Promise<void> {
    const { spec, serialization } = procedure;
    const ctx = new DirectContext(spec.method, req, res, values);
    let body: Uint8Array;
    try {
      const answer = await spec.impl(input as never, ctx);
      const wire = binary ? (answer as BinaryAnswer)[binaryAnswer]?.() : undefined;
      // Over the size limit, the usual path gives Connect's own error.
      body = wire && wire.byteLength <= this.options.writeMaxBytes ? wire : serialization.getO(binary).serialize(create(spec.method.output, answer as never));
    } catch (e) {
      ctx.finish(e);
      const err = e instanceof ConnectError ? e : new ConnectError("internal error", Code.Internal, undefined, undefined, e);
      return error(await this.errorResponse(err, ctx, req));
    }
    ctx.finish(callOver);
    const head: OutgoingHttpHeaders = { "content-type": binary ? contentTypeUnaryProto : contentTypeUnaryJson };
    if (body.byteLength >= this.options.compressMinBytes) body = await this.compress(body, req, head);
    head["content-length"] = body.byteLength;
    if (ctx.touchedHeaders) addHeaders(head, trailerMux(ctx.responseHeader, ctx.responseTrailer));
    if (res.destroyed) return;
    writeHead(res, 200, head);
    res.end(body);
  }

  private async compress(body: Uint8Array, req: HttpRequest, head: OutgoingHttpHeaders): Promise<Uint8Array> {
    const accepted = req.headers["accept-encoding"];
    const { response } = compressionNegotiate(this.options.acceptCompression, null, accepted ?? null, "accept-encoding");
    if (!response) return body;
    head["content-encoding"] = response.name;
    return response.compress(body);
  }

  // The answer Connect's unary handler gives for `err` (its compression included).
  private async errorResponse(err: ConnectError, ctx: DirectContext, req: HttpRequest): Promise<UniversalServerResponse> {
    const header = new Headers(ctx.touchedHeaders ? ctx.responseHeader : undefined);
    header.set("content-type", contentTypeUnaryJson);
    err.metadata.forEach((value, key) => header.set(key, value));
    let body = errorToJsonBytes(err, this.options.jsonOptions);
    const head: OutgoingHttpHeaders = {};
    if (body.byteLength >= this.options.compressMinBytes) body = await this.compress(body, req, head);
    if (head["content-encoding"]) header.set("content-encoding", String(head["content-encoding"]));
    const muxed = trailerMux(header, ctx.touchedHeaders ? ctx.responseTrailer : new Headers());
    muxed.set("content-length", String(body.byteLength));
    return { status: codeToHttpStatus(err.code), header: muxed, body: createAsyncIterable([body]) };
  }
}

const callOver = new ConnectError("the call is over", Code.Canceled);

// Collects a request body up to `limit` bytes. Past the limit it stops reading and hands
// `over` the body as read so far followed by the rest of the stream. Neither is called
// when the request breaks off first.
function readBody(req: HttpRequest, limit: number, over: (body: AsyncIterable<Uint8Array>) => void, done: (bytes: Uint8Array) => void): void {
  const chunks: Buffer[] = [];
  let size = 0;
  // The 'error' listener stays: a request that breaks off later must not throw.
  const stop = (): void => {
    req.off("data", onData);
    req.off("end", onEnd);
  };
  const onData = (chunk: Buffer): void => {
    chunks.push(chunk);
    size += chunk.byteLength;
    if (size <= limit) return;
    stop();
    req.pause();
    over(
      (async function* () {
        yield* chunks;
        for await (const chunk of req as AsyncIterable<Buffer>) yield chunk;
      })(),
    );
  };
  const onEnd = (): void => {
    stop();
    done(chunks.length === 1 ? chunks[0]! : Buffer.concat(chunks, size));
  };
  req.on("data", onData);
  req.on("end", onEnd);
  req.on("error", stop);
}

function addHeaders(head: OutgoingHttpHeaders, headers: Headers): void {
  headers.forEach((value, key) => {
    if (key === "set-cookie") head[key] = headers.getSetCookie();
    else head[key] = value;
  });
}

/**
 * A HandlerContext that builds what a call reads only when it reads it: the signal, the
 * request headers as web Headers, the response headers. Its signal aborts when the
 * client goes away before the answer, and when the call is over (as Connect's does).
 */
class DirectContext implements HandlerContext {
  readonly service: DescService;
  readonly requestMethod = "POST";
  readonly protocolName = "connect";
  readonly timeoutMs = (): number | undefined => undefined;
  private controller: AbortController | undefined;
  private over = false;
  private header: Headers | undefined;
  private headerOut: Headers | undefined;
  private trailerOut: Headers | undefined;
  private contextValues: ContextValues | undefined;

  constructor(
    readonly method: DescMethod,
    private readonly req: HttpRequest,
    private readonly res: HttpResponse,
    private readonly makeValues: () => ContextValues,
  ) {
    this.service = method.parent;
  }

  get signal(): AbortSignal {
    if (!this.controller) {
      const controller = (this.controller = new AbortController());
      if (this.over) controller.abort(callOver);
      else if (this.res.destroyed) controller.abort(new ConnectError("the client went away", Code.Canceled));
      else {
        this.res.once("close", () => {
          if (!this.over) controller.abort(new ConnectError("the client went away", Code.Canceled));
        });
      }
    }
    return this.controller.signal;
  }

  get requestHeader(): Headers {
    if (!this.header) {
      const header = (this.header = new Headers());
      for (const [key, value] of Object.entries(this.req.headers)) {
        if (Array.isArray(value)) for (const v of value) header.append(key, v);
        else if (value !== undefined) header.append(key, value);
      }
    }
    return this.header;
  }

  get responseHeader(): Headers {
    return (this.headerOut ??= new Headers());
  }

  get responseTrailer(): Headers {
    return (this.trailerOut ??= new Headers());
  }

  get touchedHeaders(): boolean {
    return this.headerOut !== undefined || this.trailerOut !== undefined;
  }

  get values(): ContextValues {
    return (this.contextValues ??= this.makeValues());
  }

  get url(): string {
    const host = this.req.headers.host ?? "";
    return new URL(this.req.url ?? "", `http://${host}`).toString();
  }

  /** The call is over: a signal handed out aborts (with the error when it failed). */
  finish(reason: unknown): void {
    this.over = true;
    if (this.controller && !this.controller.signal.aborted) this.controller.abort(reason);
  }
}
