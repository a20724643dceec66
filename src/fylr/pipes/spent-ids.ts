/** Why a pipe id can no longer be served. */
export type SpentReason = "used" | "expired" | "cancelled";

/** Limits of the spent-id memory. */
export interface SpentIdsOptions {
  /** Most ids remembered; the oldest is forgotten first (default 100,000). */
  readonly capacity?: number;
  /** How long an id is remembered (default 10 minutes). */
  readonly retainMs?: number;
  /** Clock, injectable for tests. */
  readonly now?: () => number;
}

/**
 * Remembers ids of pipes that were used or expired, so a late or repeated request gets
 * "gone" (410) instead of "unknown" (404). Bounded in count and age. The order of adding
 * is kept in a queue beside the lookup map: a Map whose oldest entries are deleted keeps
 * their holes at its front for a while, and iterating it from the front to find the
 * oldest walked over all of them on every add (tens of µs per pipe once it was full).
 */
export class SpentIds {
  private readonly entries = new Map<string, { reason: SpentReason; at: number }>();
  // Every add in order, oldest from `head` on; ids re-added or forgotten stay until pruned.
  private order: { id: string; at: number }[] = [];
  private head = 0;
  private readonly capacity: number;
  private readonly retainMs: number;
  private readonly now: () => number;

  constructor(options: SpentIdsOptions = {}) {
    this.capacity = Math.max(1, options.capacity ?? 100_000);
    this.retainMs = options.retainMs ?? 10 * 60_000;
    this.now = options.now ?? Date.now;
  }

  /** Records `id` as spent. */
  add(id: string, reason: SpentReason): void {
    const at = this.now();
    this.entries.set(id, { reason, at });
    this.order.push({ id, at });
    this.prune();
  }

  /** Why `id` is spent, or undefined when it is not remembered. */
  get(id: string): SpentReason | undefined {
    this.prune();
    return this.entries.get(id)?.reason;
  }

  /** Number of ids remembered. */
  get size(): number {
    return this.entries.size;
  }

  /** Forgets everything. */
  clear(): void {
    this.entries.clear();
    this.order = [];
    this.head = 0;
  }

  private prune(): void {
    const cutoff = this.now() - this.retainMs;
    const order = this.order;
    while (this.head < order.length) {
      const oldest = order[this.head]!;
      const entry = this.entries.get(oldest.id);
      // A queue slot of an id added again later, or already forgotten: only skipped.
      const current = entry !== undefined && entry.at === oldest.at;
      if (current && this.entries.size <= this.capacity && oldest.at > cutoff) break;
      if (current) this.entries.delete(oldest.id);
      this.head++;
    }
    if (this.head > 1024 && this.head * 2 > order.length) {
      this.order = order.slice(this.head);
      this.head = 0;
    }
  }
}
