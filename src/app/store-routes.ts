/**
 * The plain-HTTP routes of the queue's store, next to QueueService on every fylr:
 *
 *   POST|PUT /queue/inputs             stream an input of any size in; answers its id
 *   GET|HEAD /queue/items/{id}/output  an item's whole output, with Range
 *
 * An upload is one database transaction: a body that is cut off, refused by a limit or
 * abandoned (the fylr dies, the client stalls past store.stallTimeout) stores nothing.
 * Every byte is reserved before it is written (store.maxTotalBytes, store.minFreeSpace):
 * a Content-Length that does not fit is refused with 507 before the body is read, a
 * chunked body the moment it would pass a limit. A
 * finished upload waits for a Submit to adopt it (stdin_upload) and is deleted after
 * store.orphanTtl if none does.
 */
import { finished } from "node:stream/promises";
import type { Readable } from "node:stream";
import { StoreLimitError, type Dispatcher } from "../dispatcher/index.js";
import {
  abortResponse,
  endResponse,
  httpStatusFor,
  isGone,
  sendText,
  uploadComplete,
  writeChunk,
  writeHead,
  type HttpResponse,
  type RawCall,
  type RawRoute,
} from "../fylr/index.js";
import { Code, SlotbrokerError } from "../shared/errors.js";
import { drained } from "../shared/streams.js";

/** Path of the upload route. */
export const INPUTS_PATH = "/queue/inputs";

/** The store's routes for a fylr's HTTP port. */
export function storeRoutes(dispatcher: Dispatcher): RawRoute[] {
  return [
    { path: INPUTS_PATH, methods: ["POST", "PUT"], handlesContinue: true, scope: "submit", handle: (call) => acceptUpload(dispatcher, call) },
    { path: "/queue/items/:id/output", methods: ["GET", "HEAD"], scope: "read", handle: (call) => serveOutput(dispatcher, call) },
  ];
}

/** The JSON answer of a finished upload. */
export interface UploadAnswer {
  /** Pass it as ExecCall.stdin_upload. */
  readonly id: string;
  readonly size: number;
  /** SHA-256 of the bytes, lower-case hex. */
  readonly sha256: string;
  /** Deleted unless a Submit takes it before then. */
  readonly expiresAt: string;
}

async function acceptUpload(dispatcher: Dispatcher, { req, res, expectContinue, logger }: RawCall): Promise<void> {
  const { blobs } = dispatcher;
  const header = req.headers["content-length"];
  const announced = header === undefined ? undefined : Number(header);
  if (announced !== undefined && !(Number.isSafeInteger(announced) && announced >= 0)) {
    return refuse(res, 400, `content-length: not a byte count: "${String(header)}"`);
  }
  const max = blobs.config.maxItemBytes;
  if (announced !== undefined && announced > max) {
    return refuse(res, 413, `${announced} bytes, over the ${max}-byte limit per item (store.maxItemBytes)`);
  }
  const writer = blobs.createWriter({ role: "input", expectedBytes: announced });
  let failure: Error | undefined;
  writer.on("error", (err) => (failure ??= err));
  // Set from the writer's 'error' at any await; read through this so it is never narrowed away.
  const failed = (): Error | undefined => failure;
  const refused = (await writer.opened) ?? failed();
  if (refused) return refuse(res, statusFor(refused), refused.message);
  // The client went away or stalled: the transaction is dropped, nothing stays.
  const stall = blobs.config.stallTimeoutMs;
  let timer: NodeJS.Timeout | undefined;
  const arm = (): void => {
    clearTimeout(timer);
    timer = setTimeout(() => writer.destroy(new SlotbrokerError(Code.DeadlineExceeded, `no upload bytes for ${stall} ms (store.stallTimeout)`)), stall);
  };
  const onClose = (): void => {
    if (!writer.result) writer.destroy(new SlotbrokerError(Code.Canceled, "the client disconnected before the upload ended"));
  };
  res.once("close", onClose);
  try {
    if (expectContinue) res.writeContinue();
    arm();
    // Iterated by hand, not with for-await: leaving that loop early destroys the request
    // and its socket before the answer that says why could be sent.
    const incoming = (req as AsyncIterable<Buffer>)[Symbol.asyncIterator]();
    let received = 0;
    for (let next = await incoming.next(); !next.done; next = await incoming.next()) {
      arm();
      received += next.value.length;
      const broken = failed();
      if (broken) throw broken;
      if (!writer.write(next.value)) await drained(writer, () => failed() ?? new Error("the store write closed"));
    }
    const broken = failed();
    if (broken) throw broken;
    if (!(await uploadComplete(req))) throw new SlotbrokerError(Code.InvalidArgument, "the upload ended before its body was complete");
    if (announced !== undefined && received !== announced) {
      throw new SlotbrokerError(Code.InvalidArgument, `the body had ${received} bytes, content-length said ${announced}`);
    }
    writer.end();
    await finished(writer);
    const blob = writer.result!;
    const answer: UploadAnswer = { ...blob, expiresAt: new Date(Date.now() + blobs.config.orphanTtlMs).toISOString() };
    const body = `${JSON.stringify(answer)}\n`;
    writeHead(res, 201, { "content-type": "application/json", "content-length": Buffer.byteLength(body), "cache-control": "no-store" });
    res.end(body);
    logger.debug({ upload: blob.id, bytes: blob.size }, "stored an upload");
  } catch (err) {
    const error = failed() ?? (err as Error);
    writer.destroy(error);
    // A database that refuses writes (disk full, read-only) makes this fylr not ready.
    dispatcher.noteWriteError(error);
    logger.info({ err: error.message }, "upload failed; nothing was stored");
    // The rest of the body is not read: the connection goes after this answer.
    sendText(res, statusFor(error), error.message, { connection: "close" });
  } finally {
    clearTimeout(timer);
    res.off("close", onClose);
  }
}

// Limits name their key; 413 for one item too large, 507 for a full store or disk.
function statusFor(err: unknown): number {
  if (err instanceof StoreLimitError) return err.limit === "store.maxItemBytes" ? 413 : 507;
  const error = SlotbrokerError.from(err, Code.Internal);
  // Postgres itself found its disk full (a remote server's disk, shared with others).
  if (error.details.sqlState === "53100") return 507;
  const code = error.code;
  if (code === Code.DeadlineExceeded) return 408;
  if (code === Code.Unavailable) return 503;
  return httpStatusFor(err);
}

function refuse(res: HttpResponse, status: number, message: string): void {
  sendText(res, status, message, { connection: "close" });
}

async function serveOutput(dispatcher: Dispatcher, { req, res, params, logger }: RawCall): Promise<void> {
  let body: { size: number; sha256: string; lastModified: string | undefined; open: (start: number, end: number) => Readable | Buffer };
  try {
    const item = await dispatcher.get(params.id ?? "");
    if (!item) return sendText(res, 404, `item ${params.id} not found`);
    if (item.state !== "succeeded") return sendText(res, 409, `item ${item.id} is ${item.state}: it has no output (yet)`);
    const inline = item.output ?? Buffer.alloc(0);
    const lastModified = item.finishedAt?.toUTCString();
    if (!item.outputBlob) {
      body = { size: inline.length, sha256: item.outputSha256 ?? "", lastModified, open: (start, end) => inline.subarray(start, end) };
    } else {
      const info = await dispatcher.blobs.info(item.outputBlob);
      if (!info) {
        return sendText(res, 410, `the output of item ${item.id} was deleted (store.retention is ${Math.round(dispatcher.blobs.config.retentionMs / 3_600_000)} h)`);
      }
      const stallMs = dispatcher.blobs.config.stallTimeoutMs;
      body = { size: info.size, sha256: info.sha256, lastModified, open: (start, end) => dispatcher.blobs.read(info, { start, end, stallMs }) };
    }
  } catch (err) {
    return sendText(res, statusFor(err), (err as Error).message);
  }
  const etag = body.sha256 ? `"${body.sha256}"` : undefined;
  // A Range under an If-Range that does not hold is ignored: the whole (changed) body, 200.
  const ifRange = req.headers["if-range"];
  const ranged = !Array.isArray(ifRange) && ifRangeHolds(ifRange, etag, body.lastModified) ? req.headers.range : undefined;
  const range = parseRange(ranged, body.size);
  if (range === "invalid") {
    return sendText(res, 416, `range ${String(req.headers.range)} is not within the ${body.size} bytes`, { "content-range": `bytes */${body.size}` });
  }
  const { start, end } = range ?? { start: 0, end: body.size };
  const headers: Record<string, string | number> = {
    "content-type": "application/octet-stream",
    "content-length": end - start,
    "accept-ranges": "bytes",
    "cache-control": "no-store",
    ...(etag ? { etag, "repr-digest": `sha-256=:${Buffer.from(body.sha256, "hex").toString("base64")}:` } : {}),
    ...(body.lastModified ? { "last-modified": body.lastModified } : {}),
    ...(range ? { "content-range": `bytes ${start}-${end - 1}/${body.size}` } : {}),
  };
  writeHead(res, range ? 206 : 200, headers);
  if (req.method === "HEAD" || start === end) return void res.end();
  const source = body.open(start, end);
  if (Buffer.isBuffer(source)) return void res.end(source);
  try {
    for await (const chunk of source as AsyncIterable<Buffer>) await writeChunk(res, chunk);
    await endResponse(res);
  } catch (err) {
    source.destroy();
    logger.info({ err: (err as Error).message, item: params.id }, "output download cut off");
    if (!isGone(res)) abortResponse(res, err as Error);
  }
}

/**
 * Whether a Range may be served under this If-Range (RFC 9110 §13.1.5): true without one;
 * with an entity tag, when it is strongly the same as `etag` (a weak tag never is); with a
 * date, when it is exactly the Last-Modified the answer carries. Anything else (another
 * tag, another date, a value that is neither) asks for the whole body.
 */
export function ifRangeHolds(header: string | undefined, etag: string | undefined, lastModified: string | undefined): boolean {
  if (header === undefined) return true;
  const value = header.trim();
  if (value.startsWith('"') || value.startsWith("W/")) return etag !== undefined && value === etag;
  const date = Date.parse(value);
  return lastModified !== undefined && !Number.isNaN(date) && date === Date.parse(lastModified);
}

/** One byte range of an RFC 9110 Range header; undefined for none (or one we ignore), "invalid" for 416. */
export function parseRange(header: string | undefined, size: number): { start: number; end: number } | undefined | "invalid" {
  if (!header) return undefined;
  const m = /^bytes=(\d*)-(\d*)$/.exec(header.trim());
  // Several ranges or another unit: answered with the whole body, as the RFC allows.
  if (!m || (m[1] === "" && m[2] === "")) return undefined;
  if (m[1] === "") {
    const suffix = Number(m[2]);
    if (suffix === 0) return "invalid";
    return { start: Math.max(0, size - suffix), end: size };
  }
  const start = Number(m[1]);
  const last = m[2] === "" ? size - 1 : Math.min(Number(m[2]), size - 1);
  if (start >= size || last < start) return "invalid";
  return { start, end: last + 1 };
}
