import { Code, ConnectError, type ConnectRouter, type HandlerContext, type ServiceImpl } from "@connectrpc/connect";
import { PipeService, type WriteRequest } from "../../../gen/slotbroker/v1/pipe_pb.js";
import { trustBody } from "../../shared/http-deadlines.js";
import { toConnectError } from "../../shared/errors.js";
import { PipeError, type PipeRegistry } from "../pipes/index.js";
import { nodeRequestKey } from "./node-request.js";
import { uploadComplete } from "./upload-complete.js";

/** Registers `PipeService` for `registry` on a Connect router. */
export function registerPipeService(router: ConnectRouter, registry: PipeRegistry): void {
  router.service(PipeService, pipeServiceImpl(registry));
}

/** `PipeService`: Read streams an in-pipe, Write fills an out-pipe. */
export function pipeServiceImpl(registry: PipeRegistry): ServiceImpl<typeof PipeService> {
  return {
    async *read(request, ctx) {
      const reader = open(() => registry.openIn(request.pipeId));
      let finished = false;
      const stop = onAbort(ctx, (reason) => reader.abort(reason));
      try {
        for await (const chunk of reader.chunks()) yield { chunk };
        reader.finish();
        finished = true;
      } catch (err) {
        reader.abort(err);
        throw toConnectError(err);
      } finally {
        stop();
        // Reached without `finished` when Connect stops the generator early (write error).
        if (!finished) reader.abort(new Error("the reader went away"));
      }
    },

    async write(requests, ctx) {
      const messages = requests[Symbol.asyncIterator]();
      const first = await messages.next();
      if (first.done) throw new ConnectError("Write needs a first message naming the pipe", Code.InvalidArgument);
      if (!first.value.pipeId) throw new ConnectError("the first WriteRequest must set pipe_id", Code.InvalidArgument);
      const writer = open(() => registry.openOut(first.value.pipeId));
      // A real pipe: its stdout arrives as the command writes it, however slowly.
      const req = ctx.values.get(nodeRequestKey);
      if (req) trustBody(req);
      const stop = onAbort(ctx, (reason) => writer.abort(reason));
      try {
        let message: IteratorResult<WriteRequest> = first;
        for (; !message.done; message = await messages.next()) {
          if (message.value.pipeId && message.value.pipeId !== writer.id) {
            throw new ConnectError("pipe_id changed in the middle of a Write stream", Code.InvalidArgument);
          }
          await writer.write(message.value.chunk);
        }
        await assertUploadComplete(ctx);
        const bytes = await writer.finish();
        return { bytesWritten: BigInt(bytes) };
      } catch (err) {
        writer.abort(err);
        throw toConnectError(err);
      } finally {
        stop();
      }
    },
  };
}

// A client reset must not pass for the end of the stream: Connect ends the message
// iterator in both cases, so ask the Node request how the body really ended.
async function assertUploadComplete(ctx: HandlerContext): Promise<void> {
  const req = ctx.values.get(nodeRequestKey);
  const complete = req === undefined || (await uploadComplete(req));
  if (!complete || ctx.signal.aborted) {
    throw new PipeError("aborted", "the Write stream was reset before it ended");
  }
}

function open<T>(fn: () => T): T {
  try {
    return fn();
  } catch (err) {
    throw toConnectError(err);
  }
}

function onAbort(ctx: HandlerContext, abort: (reason: unknown) => void): () => void {
  const listener = (): void => abort(ctx.signal.reason ?? new Error("the call was cancelled"));
  ctx.signal.addEventListener("abort", listener, { once: true });
  return () => ctx.signal.removeEventListener("abort", listener);
}
