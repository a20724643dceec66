/**
 * Whether one kind's part of the queue (exec or local) may hold an item this fylr could
 * claim. A claim pass runs for many reasons (an item finished, execserver capacity
 * changed, a notification), and many of them cannot have queued an item of each kind;
 * asking Postgres anyway cost a statement (and its trigger) per kind and pass. Once a claim
 * found the queue of its kind drained, later passes skip it until something may have
 * queued one: a queue notification, a poll, this fylr's own submit or retry. A
 * notification that arrives while the claim is in flight keeps the hint open (the claim's
 * snapshot may predate the item).
 */
export class QueueHint {
  private generation = 0;
  private empty = false;

  /** Something may have queued an item of this kind: the next pass claims again. */
  maybeQueued(): void {
    this.generation += 1;
    this.empty = false;
  }

  /** True when the last claim drained the queue and nothing may have been queued since. */
  get knownEmpty(): boolean {
    return this.empty;
  }

  /** Call before a claim; hand the token to `sawEmpty`. */
  begin(): number {
    return this.generation;
  }

  /** The claim begun with `token` left no claimable item of this kind. */
  sawEmpty(token: number): void {
    if (token === this.generation) this.empty = true;
  }
}
