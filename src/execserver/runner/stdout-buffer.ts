/** Stdout is held in memory up to this many bytes; only output that passes it is streamed. */
export const STDOUT_BUFFER_LIMIT = 4000;

/**
 * What to do with a chunk of stdout:
 * - `hold`: keep it; nothing is sent yet (the output may still fit in the receipt);
 * - `commit`: the output just passed the limit; open the stream and send `data`, which is
 *   every byte so far (the held prefix followed by this chunk);
 * - `forward`: already committed; send `data` (this chunk) on.
 */
export type StdoutStep =
  | { readonly kind: "hold" }
  | { readonly kind: "commit"; readonly data: Buffer }
  | { readonly kind: "forward"; readonly data: Buffer };

/**
 * Receipt buffering: holds stdout until it passes `limit` bytes and then commits to
 * streaming, so a command that fails with small output never shows up as an empty (or
 * short) stream. Keeps the first `limit` bytes as the receipt's prefix and counts all
 * bytes. Pure: no I/O, and never more than `limit` bytes retained.
 */
export class StdoutBuffer {
  readonly #limit: number;
  // Allocated at the first byte: most jobs of a busy host print nothing.
  #prefix: Buffer | undefined;
  #prefixLength = 0;
  #total = 0;
  #state: "holding" | "committed" = "holding";

  constructor(limit: number = STDOUT_BUFFER_LIMIT) {
    if (!Number.isInteger(limit) || limit < 0) throw new RangeError(`stdout buffer limit must be a non-negative integer, got ${limit}`);
    this.#limit = limit;
  }

  /** Accounts for one chunk and says whether to hold, commit or forward it. */
  push(chunk: Buffer): StdoutStep {
    const held = this.#prefixLength;
    this.#total += chunk.length;
    const prefix = (this.#prefix ??= Buffer.alloc(this.#limit));
    if (held < this.#limit) {
      // Copy rather than keep a slice: a slice would pin the whole (often 64 KiB) chunk.
      this.#prefixLength += chunk.copy(prefix, held, 0, Math.min(chunk.length, this.#limit - held));
    }
    if (this.#state === "committed") return { kind: "forward", data: chunk };
    if (this.#total <= this.#limit) return { kind: "hold" };
    this.#state = "committed";
    return { kind: "commit", data: Buffer.concat([prefix.subarray(0, held), chunk]) };
  }

  /** The first ≤ limit bytes of stdout, as a copy the caller may keep. */
  prefix(): Buffer {
    return this.#prefix ? Buffer.from(this.#prefix.subarray(0, this.#prefixLength)) : Buffer.alloc(0);
  }

  /** Total stdout bytes seen. */
  get total(): number {
    return this.#total;
  }

  /** True once the output has passed the limit (whether or not anything was sent). */
  get committed(): boolean {
    return this.#state === "committed";
  }
}
