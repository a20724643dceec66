/** How reconnect delays grow: exponential from `initialMs`, capped at `maxMs`, jittered. */
export interface BackoffPolicy {
  readonly initialMs: number;
  readonly maxMs: number;
  /** Growth factor per failed attempt (default 2). */
  readonly multiplier?: number;
  /**
   * Fraction of the delay that is randomised (0..1, default 0.5): the delay is drawn from
   * [d·(1−jitter), d]. Spreads the reconnects of many fylrs after an execserver restart.
   */
  readonly jitter?: number;
}

/** The delay before reconnect attempt `attempt` (0 = the first retry). Pure but for `random`. */
export function backoffDelay(attempt: number, policy: BackoffPolicy, random: () => number = Math.random): number {
  const multiplier = policy.multiplier ?? 2;
  const jitter = Math.min(1, Math.max(0, policy.jitter ?? 0.5));
  // Cap the exponent so a long outage cannot overflow to Infinity.
  const raw = policy.initialMs * multiplier ** Math.min(attempt, 64);
  const capped = Math.min(policy.maxMs, raw);
  return Math.max(0, Math.round(capped * (1 - jitter * random())));
}
