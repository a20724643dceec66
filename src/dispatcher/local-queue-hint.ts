/**
 * Whether the local part of the queue may hold an item this fylr could claim. A claim pass
 * runs for many reasons (an exec item finished, execserver capacity changed, a submit of an
 * exec item), and most of them cannot have queued a local item; asking Postgres anyway cost
 * a statement (and its trigger) per pass. Once a local claim found nothing to take, later
 * passes skip it until something may have queued one: a queue notification, a poll, this
 * fylr's own submit or retry. A notification that arrives while a local claim is in flight
 * keeps the hint open (the claim's snapshot may predate the item).
 */
export class LocalQueueHint {
  private generation = 0;
  private empty = false;

  /** Something may have queued a local item: the next pass claims local items again. */
  maybeQueued(): void {
    this.generation += 1;
    this.empty = false;
  }

  /** True when the last local claim found nothing and nothing may have been queued since. */
  get knownEmpty(): boolean {
    return this.empty;
  }

  /** Call before a local claim; hand the token to `sawEmpty`. */
  begin(): number {
    return this.generation;
  }

  /** The claim begun with `token` found no claimable local item. */
  sawEmpty(token: number): void {
    if (token === this.generation) this.empty = true;
  }
}
