// Load profiles. Upper-case keys go to the k6 scripts as __ENV variables unchanged.
//   ci     short: the whole run takes a few minutes on 2 cores (it runs in .ci/run)
//   local  longer and wider, for a workstation: more VUs, longer steady windows

/** The profile names. */
export type ProfileName = "ci" | "local";

/** The sizes of every scenario in one profile. */
export interface Profile {
  readonly brokerFairness: {
    /** Slots of the shared waitgroup. */
    readonly processes: number;
    readonly VUS: number;
    readonly PROBES: number;
    readonly DURATION_S: number;
    readonly WARMUP_S: number;
    readonly COOLDOWN_S: number;
    readonly HEADROOM: number;
    readonly HOLD_MS: number;
    readonly LATENCY_P95_MS: number;
  };
  readonly priority: {
    readonly WORLDS: number;
    readonly LOW_STREAMS: number;
    readonly HIGH_STREAMS: number;
    readonly BACKLOG: number;
    readonly DURATION_S: number;
    readonly MIN_DECIDED: number;
  };
  readonly churn: {
    readonly STEADY: number;
    readonly WAVES: number;
    readonly WAVE_VUS: number;
    readonly WAVE_S: number;
  };
  readonly claimFairness: {
    readonly fylrs: number;
    /** Slots per execserver (there are two). */
    readonly processes: number;
    readonly headroom: number;
    /** Each item runs `sleep JOB_S` on an execserver. */
    readonly JOB_S: number;
    /** Submissions per second, spread over the fylrs. */
    readonly RATE: number;
    readonly SUBMIT_S: number;
    readonly DRAIN_TIMEOUT_S: number;
  };
}

/** Both profiles. */
export const profiles: Record<ProfileName, Profile> = {
  ci: {
    brokerFairness: {
      processes: 16,
      VUS: 200,
      PROBES: 4,
      DURATION_S: 40,
      WARMUP_S: 10,
      COOLDOWN_S: 3,
      HEADROOM: 4,
      HOLD_MS: 40,
      LATENCY_P95_MS: 20,
    },
    priority: { WORLDS: 2, LOW_STREAMS: 16, HIGH_STREAMS: 3, BACKLOG: 10, DURATION_S: 20, MIN_DECIDED: 200 },
    churn: { STEADY: 20, WAVES: 3, WAVE_VUS: 40, WAVE_S: 8 },
    claimFairness: { fylrs: 4, processes: 8, headroom: 2, JOB_S: 0.5, RATE: 40, SUBMIT_S: 30, DRAIN_TIMEOUT_S: 60 },
  },
  local: {
    brokerFairness: {
      processes: 32,
      VUS: 500,
      PROBES: 4,
      DURATION_S: 120,
      WARMUP_S: 20,
      COOLDOWN_S: 5,
      HEADROOM: 4,
      HOLD_MS: 40,
      LATENCY_P95_MS: 20,
    },
    priority: { WORLDS: 4, LOW_STREAMS: 32, HIGH_STREAMS: 4, BACKLOG: 20, DURATION_S: 60, MIN_DECIDED: 1000 },
    churn: { STEADY: 50, WAVES: 6, WAVE_VUS: 150, WAVE_S: 12 },
    claimFairness: { fylrs: 6, processes: 16, headroom: 2, JOB_S: 0.5, RATE: 80, SUBMIT_S: 120, DRAIN_TIMEOUT_S: 120 },
  },
};
