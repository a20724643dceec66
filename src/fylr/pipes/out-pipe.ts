import type { Writable } from "node:stream";
import { abortError, type PipeError } from "./errors.js";
import { PipeBase, type PipeContext } from "./pipe-state.js";

/** The transport's side of an opened out-pipe: write chunks, then finish or abort. */
export interface OutPipeWriter {
  readonly id: string;
  /** Writes one chunk to the sink; resolves when the sink can take more (backpressure). */
  write(chunk: Uint8Array): Promise<void>;
  /** Ends the sink after the last chunk; resolves with the byte count once it flushed. */
  finish(): Promise<number>;
  /** Marks the upload failed: the sink is destroyed with the error, `done` rejects. */
  abort(cause: unknown): void;
}

/** An out-pipe: takes one job's stdout from exactly one writer into the owner's sink. */
export class OutPipe extends PipeBase {
  private sinkError: unknown;

  constructor(
    private readonly sink: Writable,
    context: PipeContext,
  ) {
    super("out", context);
    // Remembered for the writer, and so that destroying the sink with an error never
    // becomes an uncaught exception when the owner has no 'error' listener of its own.
    sink.on("error", (err) => {
      this.sinkError ??= err;
    });
  }

  /** waiting → streaming: hands the pipe to its one writer. */
  open(): OutPipeWriter {
    this.markOpened();
    return {
      id: this.id,
      write: (chunk) => this.write(chunk),
      finish: () => this.finish(),
      abort: (cause) => this.fail(abortError(cause)),
    };
  }

  protected override release(error: PipeError): void {
    this.sink.destroy(error);
  }

  private async write(chunk: Uint8Array): Promise<void> {
    this.assertStreaming();
    this.assertSinkUsable();
    if (chunk.byteLength === 0) return;
    this.bytes += chunk.byteLength;
    if (!this.sink.write(chunk)) await drained(this.sink);
    this.assertStreaming();
  }

  private async finish(): Promise<number> {
    this.assertStreaming();
    this.assertSinkUsable();
    await new Promise<void>((resolve, reject) => {
      const sink = this.sink;
      const cleanup = (): void => {
        sink.off("finish", onFinish);
        sink.off("error", onError);
        sink.off("close", onClose);
      };
      const onFinish = (): void => {
        cleanup();
        resolve();
      };
      const onError = (err: Error): void => {
        cleanup();
        reject(err);
      };
      const onClose = (): void => {
        cleanup();
        reject(sink.errored ?? new Error("sink closed before it finished"));
      };
      sink.on("finish", onFinish);
      sink.on("error", onError);
      sink.on("close", onClose);
      sink.end();
    }).catch((err: unknown) => {
      const error = abortError(err);
      this.fail(error);
      throw error;
    });
    this.assertStreaming();
    this.markDone();
    return this.bytes;
  }

  private assertSinkUsable(): void {
    const failure = this.sinkError ?? this.sink.errored;
    if (failure) throw abortError(failure);
    if (this.sink.destroyed || this.sink.writableEnded) throw abortError(new Error("the sink was closed by its owner"));
  }
}

/** Resolves on 'drain'; rejects when the stream errors or closes first. */
function drained(stream: Writable): Promise<void> {
  return new Promise((resolve, reject) => {
    const cleanup = (): void => {
      stream.off("drain", onDrain);
      stream.off("error", onError);
      stream.off("close", onClose);
    };
    const onDrain = (): void => {
      cleanup();
      resolve();
    };
    const onError = (err: unknown): void => {
      cleanup();
      reject(abortError(err));
    };
    const onClose = (): void => {
      cleanup();
      reject(abortError(stream.errored ?? new Error("the sink closed while writing")));
    };
    stream.on("drain", onDrain);
    stream.on("error", onError);
    stream.on("close", onClose);
  });
}
