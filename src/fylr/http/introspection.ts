/**
 * What stock gRPC tools expect of any server, for the fylr's Connect router: server
 * reflection (v1 and v1alpha, from the same descriptors as the execserver's) and
 * grpc.health.v1.Health, plus the answer to a path no service serves — UNIMPLEMENTED in
 * the caller's own protocol, never an HTTP 404 a gRPC client cannot read.
 */
import { create, fromBinary, toBinary } from "@bufbuild/protobuf";
import { Code, ConnectError, type ConnectRouter, type HandlerContext } from "@connectrpc/connect";
import {
  Health,
  HealthCheckResponse_ServingStatus as ServingStatus,
  HealthCheckResponseSchema,
  type HealthCheckResponse,
} from "../../../gen/grpc/health/v1/health_pb.js";
import { ServerReflection as ReflectionV1, ServerReflectionRequestSchema } from "../../../gen/grpc/reflection/v1/reflection_pb.js";
import {
  ServerReflection as ReflectionV1alpha,
  ServerReflectionResponseSchema as AlphaResponseSchema,
} from "../../../gen/grpc/reflection/v1alpha/reflection_pb.js";
import { linkedAbortController, sleep, workOver } from "../../shared/abort.js";
import { lazyReflectionIndex } from "../../shared/reflection.js";
import type { HttpRequest, HttpResponse } from "./http-types.js";
import { sendText, writeHead } from "./responses.js";

/** Options of the fylr's gRPC health service. */
export interface HealthOptions {
  /** True while the fylr serves; false answers NOT_SERVING for every service. */
  readonly serving: () => boolean;
  /** Aborted when the server closes: open Watch streams send NOT_SERVING and end. */
  readonly closing: AbortSignal;
  /** How often Watch re-reads `serving` (default 1 s). */
  readonly watchPollMs?: number;
}

/**
 * Adds grpc.health.v1.Health and server reflection for every service already on `router`.
 * Call it after the other services are registered.
 */
export function registerIntrospection(router: ConnectRouter, health: HealthOptions): void {
  const own = [...new Set(router.handlers.map((h) => h.service.typeName))];
  const healthNames = new Set(["", ...own]);
  const index = lazyReflectionIndex(own);
  const status = (service: string): ServingStatus => {
    if (!healthNames.has(service)) return ServingStatus.SERVICE_UNKNOWN;
    return !health.closing.aborted && health.serving() ? ServingStatus.SERVING : ServingStatus.NOT_SERVING;
  };
  const response = (s: ServingStatus): HealthCheckResponse => create(HealthCheckResponseSchema, { status: s });
  router.service(Health, {
    check: (req) => {
      const s = status(req.service);
      if (s === ServingStatus.SERVICE_UNKNOWN) throw new ConnectError(`health: unknown service "${req.service}"`, Code.NotFound);
      return response(s);
    },
    async *watch(req, ctx) {
      let last: ServingStatus | undefined;
      for (;;) {
        const s = status(req.service);
        if (s !== last) yield response((last = s));
        if (health.closing.aborted || ctx.signal.aborted) return;
        // Ends early when the server starts closing: the next round sends NOT_SERVING.
        await pause(health.watchPollMs ?? 1000, ctx, health.closing);
      }
    },
    list: () => ({ statuses: Object.fromEntries([...healthNames].map((name) => [name, response(status(name))])) }),
  });
  router.service(ReflectionV1, {
    async *serverReflectionInfo(requests) {
      for await (const request of requests) yield index().answer(request);
    },
  });
  // The same wire format under another name: answered by re-reading the bytes as v1.
  router.service(ReflectionV1alpha, {
    async *serverReflectionInfo(requests) {
      for await (const request of requests) {
        const v1 = fromBinary(ServerReflectionRequestSchema, toBinary(ReflectionV1alpha.method.serverReflectionInfo.input, request));
        yield fromBinary(AlphaResponseSchema, toBinary(ReflectionV1.method.serverReflectionInfo.output, index().answer(v1)));
      }
    },
  });
}

// Resolves after `ms`, or as soon as the call or the server is done.
async function pause(ms: number, ctx: HandlerContext, closing: AbortSignal): Promise<void> {
  const linked = linkedAbortController(ctx.signal, closing);
  try {
    await sleep(ms, linked.signal);
  } catch {
    // aborted: the caller looks at why
  } finally {
    linked.abort(workOver);
  }
}

/**
 * Answers a request no route serves. A gRPC or gRPC-Web call gets a trailers-only
 * response with grpc-status 12 (UNIMPLEMENTED); a Connect call gets 404 with a Connect
 * error body (code "unimplemented"); anything else a plain 404.
 */
export function answerUnknownRoute(req: HttpRequest, res: HttpResponse): void {
  const what = `${req.method ?? "?"} ${req.url ?? "?"}`;
  const contentType = String(req.headers["content-type"] ?? "").toLowerCase();
  if (contentType.startsWith("application/grpc")) {
    const headers = {
      "content-type": contentType.split(";", 1)[0]!,
      "grpc-status": String(Code.Unimplemented),
      "grpc-message": grpcMessage(`unknown method ${req.url ?? "?"}`),
    };
    // Over HTTP/2 the status must ride the one HEADERS frame that ends the stream
    // ("Trailers-Only"); the compatibility API's end() would add an empty DATA frame.
    if ("stream" in res) res.stream.respond({ ":status": 200, ...headers }, { endStream: true });
    else {
      writeHead(res, 200, headers);
      res.end();
    }
    return;
  }
  const connect =
    req.method === "POST" &&
    (contentType.startsWith("application/json") || contentType.startsWith("application/proto") || contentType.startsWith("application/connect+"));
  if (connect) {
    writeHead(res, 404, { "content-type": "application/json" });
    res.end(JSON.stringify({ code: "unimplemented", message: `no procedure at ${req.url ?? "?"}` }));
    return;
  }
  sendText(res, 404, `no route for ${what}`);
}

// grpc-message is percent-encoded, but only outside printable ASCII and "%" itself
// (gRPC over HTTP/2, "Responses"): clients decode no more than that.
export function grpcMessage(text: string): string {
  let out = "";
  for (const byte of Buffer.from(text, "utf8")) {
    out += byte >= 0x20 && byte <= 0x7e && byte !== 0x25 ? String.fromCharCode(byte) : `%${byte.toString(16).toUpperCase().padStart(2, "0")}`;
  }
  return out;
}
