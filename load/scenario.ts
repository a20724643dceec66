// What a load scenario is, for load/scenarios.ts and the runner.
import type { K6Summary } from "./k6.js";
import type { ProfileName } from "./profiles.js";
import type { ServerContext } from "./servers.js";

/** A check the runner makes itself (outside k6), e.g. against Postgres. */
export interface RunnerCheck {
  readonly name: string;
  readonly ok: boolean;
  readonly detail: string;
}

/** A scenario once its servers are up. */
export interface PreparedScenario {
  /** Variables for the k6 script (__ENV). */
  readonly env: Record<string, string | number>;
  /** Checks after k6 has finished, while the servers are still up. */
  readonly after?: (summary: K6Summary | undefined) => Promise<RunnerCheck[]>;
}

/** One figure for the results table. */
export interface Figure {
  readonly label: string;
  readonly metric: string;
  readonly stat: string;
  /** Digits after the point (default 0). */
  readonly digits?: number;
}

/** A load scenario. */
export interface Scenario {
  readonly name: string;
  /** load/scripts/<script>. */
  readonly script: string;
  /** Upper bound for the k6 run, after which the runner stops it (seconds). */
  readonly timeoutSeconds: (profile: ProfileName) => number;
  readonly figures: readonly Figure[];
  prepare(ctx: ServerContext, profile: ProfileName): Promise<PreparedScenario>;
}
