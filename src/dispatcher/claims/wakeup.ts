import type { WakeSource } from "../events.js";

/**
 * Wakes the dispatcher loop early. A `notify()` that arrives while the loop is busy is kept
 * until the next `wait()`, which then returns at once: an item that finished mid-pass is
 * never missed until the next poll.
 */
export class Wakeup {
  private pending: WakeSource | undefined;
  private waiter: ((source: WakeSource) => void) | undefined;

  /** Ends the current wait, or the next one if nobody is waiting. */
  notify(source: WakeSource = "notify"): void {
    if (this.waiter) this.waiter(source);
    else this.pending ??= source;
  }

  /** Forgets a kept notify: the pass about to start covers whatever it was about. */
  clear(): void {
    this.pending = undefined;
  }

  /** Resolves with what woke it: a notify's source, or "poll" after `ms`; rejects with the signal's reason. */
  wait(ms: number, signal: AbortSignal): Promise<WakeSource> {
    if (signal.aborted) return Promise.reject(signal.reason as Error);
    const pending = this.pending;
    if (pending) {
      this.pending = undefined;
      return Promise.resolve(pending);
    }
    return new Promise((resolve, reject) => {
      const done = (): void => {
        clearTimeout(timer);
        signal.removeEventListener("abort", onAbort);
        this.waiter = undefined;
      };
      const timer = setTimeout(() => {
        done();
        resolve("poll");
      }, ms);
      const onAbort = (): void => {
        done();
        reject(signal.reason as Error);
      };
      signal.addEventListener("abort", onAbort, { once: true });
      this.waiter = (source) => {
        done();
        resolve(source);
      };
    });
  }
}
