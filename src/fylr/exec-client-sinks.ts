import { Writable } from "node:stream";
import { drained } from "../shared/streams.js";

/**
 * The out-pipe's sink in front of the caller's stdout. It forwards bytes once the
 * execserver starts streaming; an out-pipe that is cancelled unused (the output fit into
 * the receipt) destroys only this wrapper, never the caller's stream. A failure after
 * streaming started is forwarded, so the caller's stream sees the aborted upload.
 */
export class ForwardingSink extends Writable {
  private started = false;
  private made: Writable | undefined;

  /** `target`, or the function that makes it at the first byte (or the end) forwarded. */
  constructor(private readonly target: Writable | (() => Writable)) {
    super({ highWaterMark: 1 << 20 });
    if (typeof target !== "function") this.made = target;
  }

  /** True once the first byte (or the end) was forwarded. */
  get forwarding(): boolean {
    return this.started;
  }

  /** The target, when it exists (always, unless it is made on demand and nothing was forwarded yet). */
  get existing(): Writable | undefined {
    return this.made;
  }

  private forward(): Writable {
    this.started = true;
    return (this.made ??= (this.target as () => Writable)());
  }

  override _write(chunk: Buffer, _encoding: BufferEncoding, callback: (error?: Error | null) => void): void {
    const target = this.forward();
    if (target.destroyed) return callback(target.errored ?? new Error("the stdout stream was destroyed"));
    if (target.write(chunk)) return callback();
    drained(target, () => target.errored ?? new Error("the stdout stream closed while writing")).then(() => callback(), callback);
  }

  override _final(callback: (error?: Error | null) => void): void {
    this.forward().end((err?: Error | null) => callback(err ?? null));
  }

  override _destroy(error: Error | null, callback: (error?: Error | null) => void): void {
    if (error && this.started && this.made && !this.made.destroyed) this.made.destroy(error);
    callback(error);
  }
}

/**
 * Collects stdout in memory up to `limit` bytes; the rest is counted and dropped. An
 * aborted upload destroys it with the error, which its owner reads from the run's result
 * (`stdoutError`) or `errored`: the 'error' event is swallowed here, so no failed job can
 * become an uncaught exception of the fylr.
 */
export class BufferCollector extends Writable {
  private readonly chunks: Buffer[] = [];
  private kept = 0;
  /** Every byte written, kept or not. */
  total = 0;

  constructor(private readonly limit = Number.POSITIVE_INFINITY) {
    super();
    this.on("error", () => undefined);
  }

  override _write(chunk: Buffer, _encoding: BufferEncoding, callback: (error?: Error | null) => void): void {
    this.total += chunk.byteLength;
    const room = this.limit - this.kept;
    if (room > 0) {
      const part = chunk.byteLength <= room ? chunk : chunk.subarray(0, room);
      this.chunks.push(part);
      this.kept += part.byteLength;
    }
    callback();
  }

  /** The collected bytes. */
  toBuffer(): Buffer {
    return Buffer.concat(this.chunks, this.kept);
  }
}
