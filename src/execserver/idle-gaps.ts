/**
 * The idle gap of one waitgroup's slots: from a slot freeing to the next job running in
 * the waitgroup. Slots are interchangeable, so frees and starts are matched oldest first:
 * the slot free longest is the one the next job fills. Pure; times come from the caller.
 * Meaningful while work waits; a gap longer than `maxGapMs` (3 s: three polls of an old
 * client) means nobody wanted the slot and is not reported.
 */
export class IdleGaps {
  private readonly freedAt: Float64Array;
  private head = 0;
  private count = 0;

  constructor(
    /** The waitgroup's slots: more free slots than that cannot be waiting. */
    slots: number,
    private readonly maxGapMs = 3_000,
  ) {
    this.freedAt = new Float64Array(Math.max(1, slots));
  }

  /** A slot freed at `now` (ms). */
  freed(now: number): void {
    const size = this.freedAt.length;
    if (this.count === size) {
      // More frees than slots: the oldest entry belongs to a slot taken without a match.
      this.head = (this.head + 1) % size;
      this.count--;
    }
    this.freedAt[(this.head + this.count) % size] = now;
    this.count++;
  }

  /** A job started at `now` (ms): its gap in ms, or undefined when no freed slot was waiting. */
  taken(now: number): number | undefined {
    if (this.count === 0) return undefined;
    const at = this.freedAt[this.head]!;
    this.head = (this.head + 1) % this.freedAt.length;
    this.count--;
    const gap = now - at;
    return gap <= this.maxGapMs ? Math.max(0, gap) : undefined;
  }
}
