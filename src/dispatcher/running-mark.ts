/**
 * When an exec item's claimed → running write happens. It is put off for a short grace
 * after the job starts (dispatcher.runningMarkDelay): a job done within it is never written
 * 'running' — its outcome goes from 'claimed' straight to the end state, saving a statement
 * and the notification that statement sends to every fylr. A longer job is written
 * 'running' once the grace has passed, and that write still checks the lease fence and a
 * cancel early in a long run. Pure timing; the write itself is the caller's.
 */

/** The running mark of one item. */
export class RunningMark {
  private timer: NodeJS.Timeout | undefined;
  private writing: Promise<void> | undefined;
  private ended = false;

  /** `write` is started at most once, after `delayMs` (at once for 0), unless the run ends first. */
  constructor(
    private readonly delayMs: number,
    private readonly write: () => Promise<void>,
  ) {}

  /** The job started (each call of a chain says so; only the first counts). */
  started(): void {
    if (this.ended || this.timer || this.writing) return;
    if (this.delayMs <= 0) {
      this.begin();
      return;
    }
    this.timer = setTimeout(() => {
      this.timer = undefined;
      if (!this.ended) this.begin();
    }, this.delayMs);
  }

  /** The run ended: a write not yet begun is skipped; one under way is waited for (the outcome must follow it). */
  async finished(): Promise<void> {
    this.ended = true;
    clearTimeout(this.timer);
    this.timer = undefined;
    await this.writing;
  }

  private begin(): void {
    this.writing = this.write();
  }
}
