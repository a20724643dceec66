/**
 * The one retry policy: exponential delays from `initialMs`, capped at `maxMs`, optionally
 * jittered, and `retry()` that runs an operation under it with an AbortSignal. Broker
 * reconnects, the dispatcher's outcome writes and its item retries all use it.
 */
import { sleep } from "./abort.js";

/** How delays grow between attempts. */
export interface RetryPolicy {
  /** The first delay. */
  readonly initialMs: number;
  /** No delay is longer. */
  readonly maxMs: number;
  /** Growth per failed attempt (default 2). */
  readonly multiplier?: number;
  /**
   * Fraction of the delay that is randomised (0..1, default 0): the delay is drawn from
   * [d·(1−jitter), d]. Spreads the retries of many clients after a shared outage.
   */
  readonly jitter?: number;
}

/** The delay before retry number `retry` (0 = the first retry). Pure but for `random`. */
export function retryDelayMs(policy: RetryPolicy, retry: number, random: () => number = Math.random): number {
  const multiplier = policy.multiplier ?? 2;
  const jitter = Math.min(1, Math.max(0, policy.jitter ?? 0));
  // Cap the exponent so a long outage cannot overflow to Infinity.
  const raw = policy.initialMs * multiplier ** Math.min(Math.max(0, retry), 64);
  const capped = Math.min(policy.maxMs, raw);
  return Math.max(0, Math.round(jitter === 0 ? capped : capped * (1 - jitter * random())));
}

/** Options of retry(). */
export interface RetryOptions {
  readonly policy: RetryPolicy;
  /** Attempts in all, the first included (default unlimited). */
  readonly maxAttempts?: number;
  /** Whether a failure is worth another attempt; the rest are thrown at once. */
  readonly retryable: (err: unknown) => boolean;
  /**
   * Stops the retrying: a pause ends at once and rejects with the signal's reason. The first
   * attempt always runs and an attempt in flight finishes (abort the operation itself for that).
   */
  readonly signal?: AbortSignal;
  /** Called before each pause, e.g. to log. `attempt` is the one that just failed (1-based). */
  readonly onRetry?: (err: unknown, attempt: number, delayMs: number) => void;
}

/**
 * Runs `operation` until it succeeds, a failure is not retryable, attempts run out (the
 * last error is thrown), or the signal aborts (its reason is thrown).
 */
export async function retry<T>(operation: (attempt: number) => Promise<T>, options: RetryOptions): Promise<T> {
  for (let attempt = 1; ; attempt++) {
    if (attempt > 1) options.signal?.throwIfAborted();
    try {
      return await operation(attempt);
    } catch (err) {
      if (!options.retryable(err) || attempt >= (options.maxAttempts ?? Infinity)) throw err;
      const pause = retryDelayMs(options.policy, attempt - 1);
      options.onRetry?.(err, attempt, pause);
      await sleep(pause, options.signal);
    }
  }
}
