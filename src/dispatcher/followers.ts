/**
 * Followers of single items (Watch streams), by item id: a notification naming 100 items
 * wakes the followers of those items, never a scan over every follower.
 */
export class ItemFollowers {
  private readonly byId = new Map<string, Set<() => void>>();

  constructor(private readonly onError: (err: unknown, id: string) => void) {}

  /** Adds `wake` for item `id`; returns the function that removes it. */
  add(id: string, wake: () => void): () => void {
    let set = this.byId.get(id);
    if (!set) this.byId.set(id, (set = new Set()));
    set.add(wake);
    return () => {
      set.delete(wake);
      if (set.size === 0 && this.byId.get(id) === set) this.byId.delete(id);
    };
  }

  /** Wakes the followers of `id`. */
  wake(id: string): void {
    const set = this.byId.get(id);
    if (!set) return;
    for (const wake of set) {
      try {
        wake();
      } catch (err) {
        this.onError(err, id);
      }
    }
  }

  /** Wakes every follower (notifications may have been missed). */
  wakeAll(): void {
    for (const id of this.byId.keys()) this.wake(id);
  }
}
