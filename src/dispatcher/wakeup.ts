/**
 * Wakes the dispatcher loop early. A `notify()` that arrives while the loop is busy is kept
 * until the next `wait()`, which then returns at once: an item that finished mid-pass is
 * never missed until the next poll.
 */
export class Wakeup {
  private pending = false;
  private waiter: (() => void) | undefined;

  /** Ends the current wait, or the next one if nobody is waiting. */
  notify(): void {
    if (this.waiter) this.waiter();
    else this.pending = true;
  }

  /** Resolves after `ms`, on notify, or rejects with the signal's reason. */
  wait(ms: number, signal: AbortSignal): Promise<void> {
    if (signal.aborted) return Promise.reject(signal.reason as Error);
    if (this.pending) {
      this.pending = false;
      return Promise.resolve();
    }
    return new Promise((resolve, reject) => {
      const done = (): void => {
        clearTimeout(timer);
        signal.removeEventListener("abort", onAbort);
        this.waiter = undefined;
      };
      const timer = setTimeout(() => {
        done();
        resolve();
      }, ms);
      const onAbort = (): void => {
        done();
        reject(signal.reason as Error);
      };
      signal.addEventListener("abort", onAbort, { once: true });
      this.waiter = () => {
        done();
        resolve();
      };
    });
  }
}
