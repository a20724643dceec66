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
 * "gone" (410) instead of "unknown" (404). Bounded in count and age: a Map keeps
 * insertion order, so the oldest entries sit at the front and pruning is O(evicted).
 */
export class SpentIds {
  private readonly entries = new Map<string, { reason: SpentReason; at: number }>();
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
    this.entries.delete(id);
    this.entries.set(id, { reason, at: this.now() });
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
  }

  private prune(): void {
    const cutoff = this.now() - this.retainMs;
    for (const [id, entry] of this.entries) {
      if (this.entries.size <= this.capacity && entry.at > cutoff) break;
      this.entries.delete(id);
    }
  }
}
