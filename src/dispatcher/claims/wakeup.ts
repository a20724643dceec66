import type { WakeSource } from "../events.js";

/**
 * Wakes the dispatcher loop early. A `notify()` that arrives while the loop is busy is kept
 * until the next `wait()`, which then returns at once: an item that finished mid-pass is
 * never missed until the next poll.
 *
 * The loop waits about once per item under load, so a wait builds neither a timer nor an
 * abort listener of its own: one timer is re-armed by each wait (a firing that finds no
 * waiter is ignored), and each signal gets one listener, kept for its life.
 */
export class Wakeup {
  private pending: WakeSource | undefined;
  private waiter: { resolve: (source: WakeSource) => void; reject: (reason: unknown) => void } | undefined;
  private timer: NodeJS.Timeout | undefined;
  private timerMs = 0;
  private watched: AbortSignal | undefined;

  /** Ends the current wait, or the next one if nobody is waiting. */
  notify(source: WakeSource = "notify"): void {
    if (this.waiter) this.end()?.resolve(source);
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
    this.watch(signal);
    return new Promise((resolve, reject) => {
      this.waiter = { resolve, reject };
      if (this.timer && this.timerMs === ms) this.timer.refresh();
      else {
        clearTimeout(this.timer);
        this.timerMs = ms;
        this.timer = setTimeout(() => this.end()?.resolve("poll"), ms);
      }
    });
  }

  private watch(signal: AbortSignal): void {
    if (this.watched === signal) return;
    this.watched = signal;
    signal.addEventListener(
      "abort",
      () => {
        // A wait under another signal since is not this one's to end.
        if (this.watched !== signal) return;
        clearTimeout(this.timer);
        this.timer = undefined;
        this.end()?.reject(signal.reason);
      },
      { once: true },
    );
  }

  private end(): Wakeup["waiter"] {
    const waiter = this.waiter;
    this.waiter = undefined;
    return waiter;
  }
}
