/**
 * A refused request answered in its caller's own protocol, before its body is read:
 * gRPC and gRPC-Web get a trailers-only response (grpc-status 16 UNAUTHENTICATED or
 * 7 PERMISSION_DENIED), a Connect stream its end-of-stream error, a Connect unary call
 * HTTP 401/403 with a Connect error body, anything else 401/403 in plain text. A 401
 * carries `WWW-Authenticate`: Basic for a browser (it asks for text/html), else Bearer.
 */
import type { OutgoingHttpHeaders } from "node:http";
import type { AccessRefusal, HttpRequest, HttpResponse } from "./http-types.js";
import { grpcMessage } from "./introspection.js";
import { sendText, writeHead } from "./responses.js";

const grpcCodes = { unauthenticated: 16, permission_denied: 7 } as const;
const httpStatuses = { unauthenticated: 401, permission_denied: 403 } as const;

/** The `WWW-Authenticate` challenge for `req`. */
export function challengeFor(req: HttpRequest): string {
  return /\btext\/html\b/.test(String(req.headers.accept ?? "")) ? 'Basic realm="slotbroker", charset="UTF-8"' : 'Bearer realm="slotbroker"';
}

/**
 * Answers `req` with `refusal`. The body is never handed to anyone: over HTTP/1.1 up to
 * `drainBytes` of it are read and dropped (so a client still sending sees this answer, not
 * a reset connection), then the connection goes; over HTTP/2 the stream is reset.
 */
export function answerRefusal(req: HttpRequest, res: HttpResponse, refusal: AccessRefusal, drainBytes: number): void {
  const tooLong = Number(req.headers["content-length"] ?? 0) > drainBytes;
  respond(req, res, refusal, !("stream" in res) && tooLong ? { connection: "close" } : {});
  dropUnreadBody(req, drainBytes);
}

function respond(req: HttpRequest, res: HttpResponse, refusal: AccessRefusal, closeAfter: OutgoingHttpHeaders): void {
  const contentType = String(req.headers["content-type"] ?? "").toLowerCase();
  const challenge: OutgoingHttpHeaders = refusal.code === "unauthenticated" ? { "www-authenticate": challengeFor(req) } : {};
  if (contentType.startsWith("application/grpc")) {
    const headers = {
      "content-type": contentType.split(";", 1)[0]!,
      "grpc-status": String(grpcCodes[refusal.code]),
      "grpc-message": grpcMessage(refusal.message),
      ...challenge,
    };
    // HTTP/2: the status rides the one HEADERS frame that ends the stream (Trailers-Only).
    if ("stream" in res) res.stream.respond({ ":status": 200, ...headers }, { endStream: true });
    else {
      writeHead(res, 200, { ...headers, ...closeAfter });
      res.end();
    }
    return;
  }
  const error = { code: refusal.code, message: refusal.message };
  if (req.method === "POST" && contentType.startsWith("application/connect+")) {
    // A Connect stream always answers 200; its end-of-stream message (flags 2) holds the error.
    const json = Buffer.from(JSON.stringify({ error }));
    const envelope = Buffer.alloc(5 + json.length);
    envelope[0] = 0x02;
    envelope.writeUInt32BE(json.length, 1);
    json.copy(envelope, 5);
    writeHead(res, 200, { "content-type": contentType.split(";", 1)[0]!, "content-length": envelope.length, ...challenge, ...closeAfter });
    res.end(envelope);
    return;
  }
  if (req.method === "POST" && (contentType.startsWith("application/json") || contentType.startsWith("application/proto"))) {
    const body = JSON.stringify(error);
    writeHead(res, httpStatuses[refusal.code], {
      "content-type": "application/json",
      "content-length": Buffer.byteLength(body),
      ...challenge,
      ...closeAfter,
    });
    res.end(body);
    return;
  }
  sendText(res, httpStatuses[refusal.code], refusal.message, { ...challenge, ...closeAfter });
}

// HTTP/2: once the answer is out, the client is told (RST_STREAM NO_ERROR, RFC 9113
// §8.1) to stop sending a body nobody reads, instead of filling the stream's window.
// Called after the answer ended: Node then sends the reset only when the answer is out.
function dropUnreadBody(req: HttpRequest, drainBytes: number): void {
  if ("stream" in req) {
    if (!req.stream.endAfterHeaders && !req.stream.destroyed) req.stream.close(0);
    return;
  }
  if (req.complete) return;
  let dropped = 0;
  req.on("data", (chunk: Buffer) => {
    dropped += chunk.length;
    if (dropped > drainBytes) req.socket.destroy();
  });
  req.resume();
}
