/** Settings that bound how an address pool grows. */
export interface GrowthPolicy {
  /** A want parked this long with no offer counts as backpressure. */
  readonly retryTickMs: number;
  /** At most one new connection per this interval, however many wants wait. */
  readonly growIntervalMs: number;
  /** Most connections per address. */
  readonly maxConnections: number;
  /** How long a "covered" mark stops growth before the pool probes again. */
  readonly reprobeMs: number;
}

/** What the pool knows at one tick; no clocks or sockets inside. */
export interface GrowthInput {
  readonly now: number;
  /** When the oldest want still parked on this pool was parked; undefined when none is. */
  readonly oldestParkedAt: number | undefined;
  /** Connections of the pool that are not closed. */
  readonly connections: number;
  /** Connections that have not yet reported their first HELLO. */
  readonly pending: number;
  /** When the pool last opened a connection to grow; undefined when it never grew. */
  readonly lastGrowthAt: number | undefined;
  /** When the pool was last marked covered; undefined when it is not. */
  readonly coveredAt: number | undefined;
}

/** Why the pool did not grow, or that it should. */
export type GrowthDecision =
  | { readonly grow: true }
  | { readonly grow: false; readonly reason: "no-backpressure" | "covered" | "at-cap" | "rate-limited" | "pending" | "polling" };

/** True while a covered mark is still in force. */
export function isCovered(input: Pick<GrowthInput, "now" | "coveredAt">, policy: Pick<GrowthPolicy, "reprobeMs">): boolean {
  return input.coveredAt !== undefined && input.now - input.coveredAt < policy.reprobeMs;
}

/**
 * Should the pool open one more connection to its address? Only under genuine
 * backpressure (a want parked for a whole retry tick), never while a previous new
 * connection has not said HELLO yet, at most one per growIntervalMs, up to the cap, and not
 * while the pool is covered (it already circled back to a known instance).
 */
export function decideGrowth(input: GrowthInput, policy: GrowthPolicy): GrowthDecision {
  if (input.oldestParkedAt === undefined || input.now - input.oldestParkedAt < policy.retryTickMs) {
    return { grow: false, reason: "no-backpressure" };
  }
  if (isCovered(input, policy)) return { grow: false, reason: "covered" };
  if (input.connections >= policy.maxConnections) return { grow: false, reason: "at-cap" };
  if (input.pending > 0) return { grow: false, reason: "pending" };
  if (input.lastGrowthAt !== undefined && input.now - input.lastGrowthAt < policy.growIntervalMs) {
    return { grow: false, reason: "rate-limited" };
  }
  return { grow: true };
}
