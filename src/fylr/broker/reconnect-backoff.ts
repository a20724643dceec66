import { retryDelayMs, type RetryPolicy } from "../../shared/retry.js";

// A stream that stayed ready at least this long resets the backoff: a server that accepts
// and drops at once must not be hammered at the initial delay.
const STABLE_MS = 1_000;

/** When a broker connection dials again after its stream went down. Pure but for `random`. */
export class ReconnectBackoff {
  private failures = 0;
  private readySince = 0;

  constructor(
    private readonly policy: RetryPolicy,
    private readonly random: () => number = Math.random,
  ) {}

  /** The stream reached ready (its first HELLO arrived). */
  ready(now = Date.now()): void {
    this.readySince = now;
  }

  /**
   * The stream went down (`wasReady`: it had reached ready). Returns the delay before the
   * next attempt and how many attempts in a row failed so far.
   */
  down(wasReady: boolean, now = Date.now()): { delayMs: number; failures: number } {
    const stable = wasReady && now - this.readySince >= STABLE_MS;
    this.failures = stable ? 0 : this.failures + 1;
    return { delayMs: retryDelayMs(this.policy, this.failures - 1, this.random), failures: this.failures };
  }
}
