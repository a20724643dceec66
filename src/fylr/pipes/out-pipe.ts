import type { Writable } from "node:stream";
import { finished } from "node:stream/promises";
import { drained } from "../../shared/streams.js";
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

  protected override release(error: PipeError | undefined): void {
    this.sink.destroy(error);
  }

  private async write(chunk: Uint8Array): Promise<void> {
    this.assertStreaming();
    this.assertSinkUsable();
    if (chunk.byteLength === 0) return;
    this.bytes += chunk.byteLength;
    if (!this.sink.write(chunk)) {
      const sink = this.sink;
      await drained(sink, () => sink.errored ?? new Error("the sink closed while writing")).catch((err: unknown) => {
        throw abortError(err);
      });
    }
    this.assertStreaming();
  }

  private async finish(): Promise<number> {
    this.assertStreaming();
    this.assertSinkUsable();
    const flushed = finished(this.sink, { readable: false, cleanup: true });
    this.sink.end();
    await flushed.catch((err: unknown) => {
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
