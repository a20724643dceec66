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

/** An out-pipe's sink, or the function that makes it when the writer arrives. */
export type OutPipeSink = Writable | (() => Writable);

/** An out-pipe: takes one job's stdout from exactly one writer into the owner's sink. */
export class OutPipe extends PipeBase {
  private sinkError: unknown;
  private made: Writable | undefined;

  constructor(
    private readonly target: OutPipeSink,
    context: PipeContext,
  ) {
    super("out", context);
    if (typeof target !== "function") this.watch(target);
  }

  private get sink(): Writable {
    return (this.made ??= this.watch((this.target as () => Writable)()));
  }

  // Remembered for the writer, and so that destroying the sink with an error never
  // becomes an uncaught exception when the owner has no 'error' listener of its own.
  private watch(sink: Writable): Writable {
    this.made = sink;
    sink.on("error", (err) => {
      this.sinkError ??= err;
    });
    return sink;
  }

  /** waiting → streaming: hands the pipe to its one writer (a sink made on demand is made now). */
  open(): OutPipeWriter {
    this.markOpened();
    void this.sink;
    return {
      id: this.id,
      write: (chunk) => this.write(chunk),
      finish: () => this.finish(),
      abort: (cause) => this.fail(abortError(cause)),
    };
  }

  // A sink never made (the pipe was not opened) has nothing to release.
  protected override release(error: PipeError | undefined): void {
    this.made?.destroy(error);
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
