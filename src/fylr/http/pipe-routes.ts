import { trustBody } from "../../shared/http-deadlines.js";
import type { Logger } from "../../shared/log.js";
import { abortError, type PipeRegistry } from "../pipes/index.js";
import type { RawCall, RawRoute } from "./http-types.js";
import { PIPE_IN_PREFIX, PIPE_OUT_PREFIX } from "./pipe-urls.js";
import { uploadComplete } from "./upload-complete.js";
import {
  abortResponse,
  endResponse,
  httpStatusFor,
  sendText,
  writeChunk,
  writeHead,
} from "./responses.js";

/** The raw routes for native tools: `GET /pipe/in/:id` and `PUT /pipe/out/:id`. */
export function pipeRawRoutes(registry: PipeRegistry): RawRoute[] {
  return [
    { path: `${PIPE_IN_PREFIX}:id`, methods: ["GET"], handle: (call) => serveInPipe(registry, call) },
    {
      path: `${PIPE_OUT_PREFIX}:id`,
      methods: ["PUT"],
      handlesContinue: true,
      handle: (call) => acceptOutPipe(registry, call),
    },
  ];
}

async function serveInPipe(registry: PipeRegistry, { res, params, logger }: RawCall): Promise<void> {
  let reader;
  try {
    reader = registry.openIn(params.id ?? "");
  } catch (err) {
    return refuse(res, err, logger);
  }
  // From here on the pipe is spent whatever happens; a reader that leaves early aborts it
  // at once instead of when the next chunk happens to arrive.
  let finished = false;
  const onClose = (): void => {
    if (!finished) reader.abort(new Error("the reader disconnected"));
  };
  res.once("close", onClose);
  try {
    const chunks = reader.chunks()[Symbol.asyncIterator]();
    // Headers wait for the first chunk, so a source that fails at once is a clean 500.
    let next = await chunks.next();
    writeHead(res, 200, {
      "content-type": "application/octet-stream",
      "cache-control": "no-store",
      ...(reader.length === undefined ? {} : { "content-length": reader.length }),
    });
    for (; !next.done; next = await chunks.next()) await writeChunk(res, next.value);
    await endResponse(res, () => (finished = true));
    reader.finish();
  } catch (err) {
    const error = abortError(err);
    reader.abort(error);
    logger.info({ err: error.message }, "in-pipe transfer failed");
    if (!res.headersSent) sendText(res, httpStatusFor(error), error.message);
    else abortResponse(res, error);
  } finally {
    res.off("close", onClose);
  }
}

async function acceptOutPipe(registry: PipeRegistry, { req, res, params, expectContinue, logger }: RawCall): Promise<void> {
  let writer;
  try {
    writer = registry.openOut(params.id ?? "");
  } catch (err) {
    return refuse(res, err, logger);
  }
  // A real pipe: its stdout arrives as the command writes it, however slowly.
  trustBody(req);
  let finished = false;
  const onClose = (): void => {
    if (!finished) writer.abort(new Error("the uploader disconnected before the body ended"));
  };
  res.once("close", onClose);
  try {
    if (expectContinue) res.writeContinue();
    for await (const chunk of req as AsyncIterable<Uint8Array>) await writer.write(chunk);
    if (!(await uploadComplete(req))) throw new Error("the upload ended before its body was complete");
    const bytes = await writer.finish();
    finished = true;
    sendText(res, 200, `${bytes} bytes written`, { "pipe-bytes-written": String(bytes) });
  } catch (err) {
    const error = abortError(err);
    writer.abort(error);
    logger.info({ err: error.message }, "out-pipe upload failed");
    sendText(res, httpStatusFor(error), error.message, { connection: "close" });
  } finally {
    res.off("close", onClose);
  }
}

function refuse(res: RawCall["res"], err: unknown, logger: Logger): void {
  const status = httpStatusFor(err);
  logger.debug({ status, err: (err as Error).message }, "pipe refused");
  sendText(res, status, (err as Error).message);
}
