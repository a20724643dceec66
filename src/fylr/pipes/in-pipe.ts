import type { Readable } from "node:stream";
import { abortError, type PipeError } from "./errors.js";
import { PipeBase, type PipeContext } from "./pipe-state.js";

/** What an in-pipe serves: a job's stdin as a stream or as bytes already in memory. */
export type InPipeSource = Readable | Uint8Array;

/** The transport's side of an opened in-pipe: read the chunks, then finish or abort. */
export interface InPipeReader {
  readonly id: string;
  /** Byte length when known up front (a buffer source), so HTTP can send Content-Length. */
  readonly length: number | undefined;
  /** The stdin bytes; iterate once. Throws the pipe's failure if it is aborted meanwhile. */
  chunks(): AsyncIterable<Uint8Array>;
  /** Marks the pipe fully served: resolves the owner's `done` with the byte count. */
  finish(): void;
  /** Marks the pipe failed (the consumer went away or the source broke). */
  abort(cause: unknown): void;
}

// Buffers are handed out in slices so a Connect message or an HTTP write stays small.
const BUFFER_SLICE = 64 * 1024;

/** An in-pipe: serves one job's stdin to exactly one reader. */
export class InPipe extends PipeBase {
  private readonly source: InPipeSource;
  private sourceError: unknown;

  constructor(source: InPipeSource, context: PipeContext) {
    super("in", context);
    this.source = source;
    if (!(source instanceof Uint8Array)) {
      // Keep a source error until the reader arrives instead of letting an unlistened
      // 'error' event crash the process.
      source.on("error", (err) => {
        this.sourceError ??= err;
      });
    }
  }

  /** waiting → streaming: hands the pipe to its one reader. */
  open(): InPipeReader {
    this.markOpened();
    const length = this.source instanceof Uint8Array ? this.source.byteLength : undefined;
    return {
      id: this.id,
      length,
      chunks: () => this.chunks(),
      finish: () => {
        this.assertStreaming();
        this.markDone();
      },
      abort: (cause) => this.fail(abortError(cause)),
    };
  }

  protected override release(error: PipeError | undefined): void {
    if (!(this.source instanceof Uint8Array)) this.source.destroy(error);
  }

  private async *chunks(): AsyncGenerator<Uint8Array> {
    this.assertStreaming();
    if (this.sourceError !== undefined) throw abortError(this.sourceError);
    const source = this.source;
    if (source instanceof Uint8Array) {
      for (let offset = 0; offset < source.byteLength; offset += BUFFER_SLICE) {
        this.assertStreaming();
        const chunk = source.subarray(offset, offset + BUFFER_SLICE);
        this.bytes += chunk.byteLength;
        yield chunk;
      }
      return;
    }
    for await (const chunk of source as AsyncIterable<Uint8Array | string>) {
      this.assertStreaming();
      const bytes = typeof chunk === "string" ? Buffer.from(chunk) : chunk;
      this.bytes += bytes.byteLength;
      yield bytes;
    }
    this.assertStreaming();
  }
}
