/**
 * Where an exec call's stdout goes: kept in memory while it is small, spilled into the
 * store once it passes the inline size. Either way it is counted and hashed as it streams,
 * so the item reports the size and SHA-256 of its whole output without holding it.
 */
import { createHash, type Hash } from "node:crypto";
import type { Readable} from "node:stream";
import { Writable } from "node:stream";
import { finished } from "node:stream/promises";
import { drained } from "../../shared/streams.js";
import { StoreLimitError, type BlobRole, type BlobStore, type BlobWriter } from "./blob-store.js";

/** An output as the item records it. */
export interface ItemOutput {
  /** The whole output when it is small; its first bytes when it went to the store. */
  readonly bytes: Buffer;
  readonly size: number;
  /** Lower-case hex. */
  readonly sha256: string;
  /** Set when the whole output is in the store. */
  readonly blobId: string | undefined;
}

/** An ItemOutput for bytes in memory (local actions, tests). */
export function inlineOutput(bytes: Buffer): ItemOutput {
  return { bytes, size: bytes.length, sha256: bytes.length === 0 ? emptySha256 : createHash("sha256").update(bytes).digest("hex"), blobId: undefined };
}

const emptySha256 = createHash("sha256").digest("hex");

/** Options of an OutputSink. */
export interface OutputSinkOptions {
  readonly role: BlobRole;
  readonly itemId: string;
  /** Up to this many bytes stay in memory; past it the output goes to the store. */
  readonly inlineBytes: number;
}

/** A Writable for one call's stdout; `output` describes it once it ended. */
export class OutputSink extends Writable {
  // Made at the first byte: most outputs are empty, and a hash costs more to build than that digest.
  private hash: Hash | undefined;
  // Held in memory until the output passes the inline size.
  private readonly head: Buffer[] = [];
  private headBytes = 0;
  // The first inlineBytes bytes, kept for the item row whatever happens.
  private readonly prefix: Buffer[] = [];
  private prefixBytes = 0;
  private bytes = 0;
  private blob: BlobWriter | undefined;
  private result: ItemOutput | undefined;
  /** The error that failed the store write (a limit, the database), if any. */
  storeError: Error | undefined;

  constructor(
    private readonly store: BlobStore,
    private readonly options: OutputSinkOptions,
  ) {
    super({ highWaterMark: 1 << 20 });
  }

  /** The finished output; undefined until the sink ended. */
  get output(): ItemOutput | undefined {
    return this.result;
  }

  override _write(chunk: Buffer, _encoding: BufferEncoding, callback: (error?: Error | null) => void): void {
    this.bytes += chunk.length;
    const max = this.store.config.maxItemBytes;
    if (this.bytes > max) {
      this.storeError ??= new StoreLimitError("store.maxItemBytes", `more than ${max} bytes, over the limit per item (store.maxItemBytes)`);
      return callback(this.storeError);
    }
    (this.hash ??= createHash("sha256")).update(chunk);
    if (this.prefixBytes < this.options.inlineBytes) {
      const part = chunk.subarray(0, this.options.inlineBytes - this.prefixBytes);
      this.prefix.push(part);
      this.prefixBytes += part.length;
    }
    if (!this.blob && this.headBytes + chunk.length <= this.options.inlineBytes) {
      this.head.push(chunk);
      this.headBytes += chunk.length;
      return callback();
    }
    if (!this.blob) this.spill();
    this.forward(chunk).then(() => callback(), (err: unknown) => callback(err as Error));
  }

  // Past the inline size: the output goes to the store, starting with what was held so far.
  private spill(): void {
    const blob = this.store.createWriter({ role: this.options.role, itemId: this.options.itemId });
    blob.on("error", (err) => {
      // A blob this sink destroyed itself (the upload aborted) did not fail the store.
      if (this.destroyed) return;
      this.storeError ??= err;
      this.destroy(err);
    });
    this.blob = blob;
    for (const part of this.head) blob.write(part);
  }

  private async forward(chunk: Buffer): Promise<void> {
    const blob = this.blob!;
    if (blob.write(chunk)) return;
    await drained(blob, () => this.storeError ?? blob.errored ?? new Error("the store write closed"));
  }

  override _final(callback: (error?: Error | null) => void): void {
    this.finish().then(() => callback(), (err: unknown) => callback(err as Error));
  }

  private async finish(): Promise<void> {
    const head = Buffer.concat(this.head, this.headBytes);
    const sha256 = this.hash ? this.hash.digest("hex") : emptySha256;
    if (!this.blob) {
      this.result = { bytes: head, size: this.bytes, sha256, blobId: undefined };
      return;
    }
    const blob = this.blob;
    blob.end();
    await finished(blob);
    const written = blob.result;
    if (!written || written.size !== this.bytes || written.sha256 !== sha256) {
      throw new Error(`the stored output does not match what was written (${written?.size ?? "?"} of ${this.bytes} bytes)`);
    }
    this.result = { bytes: Buffer.concat(this.prefix, this.prefixBytes), size: this.bytes, sha256, blobId: blob.id };
  }

  override _destroy(error: Error | null, callback: (error?: Error | null) => void): void {
    if (this.blob && !this.blob.result) this.blob.destroy(error ?? undefined);
    callback(error);
  }
}

/** The bytes of an output for the next call's stdin: from memory, or streamed from the store. */
export function readOutput(store: BlobStore, output: ItemOutput): Buffer | Readable {
  if (!output.blobId) return output.bytes;
  return store.read({ id: output.blobId, size: output.size, chunkBytes: store.config.chunkBytes });
}
