/**
 * Waits, with a timeout, for a count of running jobs to reach zero. The owner calls
 * jobFinished() whenever a job ends and releaseAll() when it stops.
 */
export class IdleWaiters {
  private waiters: (() => void)[] = [];

  constructor(private readonly running: () => number) {}

  /** A job ended: wake the waiters once none runs. */
  jobFinished(): void {
    if (this.running() > 0) return;
    this.releaseAll();
  }

  /** Wakes every waiter (each resolves with whether nothing runs). */
  releaseAll(): void {
    for (const resolve of this.waiters.splice(0)) resolve();
  }

  /** True once nothing runs, false if timeoutMs passed first. */
  wait(timeoutMs: number): Promise<boolean> {
    if (this.running() === 0) return Promise.resolve(true);
    return new Promise((resolve) => {
      const timer = setTimeout(() => {
        this.waiters = this.waiters.filter((w) => w !== done);
        resolve(false);
      }, timeoutMs);
      const done = (): void => {
        clearTimeout(timer);
        resolve(this.running() === 0);
      };
      this.waiters.push(done);
    });
  }
}
