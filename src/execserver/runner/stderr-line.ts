const EMPTY = Buffer.alloc(0);

/** The receipt's stderr line is capped at this many bytes (of UTF-8). */
export const STDERR_LINE_LIMIT = 1000;

/**
 * Tracks the last non-empty line of a byte stream with bounded memory: two fixed buffers
 * of `limit` bytes (the line being read and the last finished non-empty one), swapped
 * rather than copied. A line longer than `limit` keeps its first `limit` bytes, since the
 * start of an error message is what names the problem. Pure: no I/O.
 */
export class LastLineTracker {
  readonly #limit: number;
  // Allocated at the first byte: most jobs write nothing to stderr.
  #current = EMPTY;
  #currentLength = 0;
  #last = EMPTY;
  #lastLength = 0;

  constructor(limit: number = STDERR_LINE_LIMIT) {
    if (!Number.isInteger(limit) || limit < 1) throw new RangeError(`line limit must be a positive integer, got ${limit}`);
    this.#limit = limit;
  }

  /** Feeds one chunk of the stream. */
  push(chunk: Buffer): void {
    if (this.#current === EMPTY) {
      this.#current = Buffer.alloc(this.#limit);
      this.#last = Buffer.alloc(this.#limit);
    }
    let start = 0;
    for (;;) {
      const newline = chunk.indexOf(0x0a, start);
      const end = newline === -1 ? chunk.length : newline;
      if (this.#currentLength < this.#limit && end > start) {
        this.#currentLength += chunk.copy(this.#current, this.#currentLength, start, Math.min(end, start + this.#limit - this.#currentLength));
      }
      if (newline === -1) return;
      this.#endLine();
      start = newline + 1;
    }
  }

  /** The last non-empty line so far (an unterminated last line counts), trimmed; "" if none. */
  line(): string {
    const current = this.#current.subarray(0, this.#currentLength);
    return lineFromBytes(isBlank(current) ? this.#last.subarray(0, this.#lastLength) : current, this.#limit);
  }

  #endLine(): void {
    if (!isBlank(this.#current.subarray(0, this.#currentLength))) {
      [this.#last, this.#current] = [this.#current, this.#last];
      this.#lastLength = this.#currentLength;
    }
    this.#currentLength = 0;
  }
}

/**
 * The receipt's line from the raw bytes of the chosen line (what `line()` picks, or what the
 * job launcher, which tracks a job's stderr itself, sends): at most `limit` bytes of them,
 * no partial character at the end, trimmed.
 */
export function lineFromBytes(bytes: Buffer, limit: number = STDERR_LINE_LIMIT): string {
  return capUtf8(withoutPartialTail(bytes.subarray(0, limit)).toString("utf8").trim(), limit);
}

/** Cuts `text` to at most `maxBytes` of UTF-8 without splitting a character. */
export function capUtf8(text: string, maxBytes: number): string {
  const bytes = Buffer.from(text, "utf8");
  if (bytes.length <= maxBytes) return text;
  return bytes.subarray(0, utf8Boundary(bytes, maxBytes)).toString("utf8");
}

/** The largest index ≤ `max` at which `bytes` can be cut without splitting a UTF-8 sequence. */
function utf8Boundary(bytes: Buffer, max: number): number {
  let cut = Math.min(max, bytes.length);
  // Step back over continuation bytes (10xxxxxx) to the start of the character at the cut.
  while (cut > 0 && cut < bytes.length && ((bytes[cut] ?? 0) & 0xc0) === 0x80) cut--;
  return cut;
}

/** Drops an incomplete UTF-8 sequence at the end (left there when a long line was cut). */
function withoutPartialTail(bytes: Buffer): Buffer {
  let start = bytes.length - 1;
  while (start > 0 && bytes.length - start < 4 && ((bytes[start] ?? 0) & 0xc0) === 0x80) start--;
  const lead = bytes[start];
  if (lead === undefined || lead < 0xc0) return bytes;
  const width = lead >= 0xf0 ? 4 : lead >= 0xe0 ? 3 : 2;
  return start + width > bytes.length ? bytes.subarray(0, start) : bytes;
}

function isBlank(bytes: Buffer): boolean {
  for (const b of bytes) {
    // space, \t, \n, \v, \f, \r
    if (b !== 0x20 && (b < 0x09 || b > 0x0d)) return false;
  }
  return true;
}
