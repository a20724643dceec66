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
  readonly fairnessKeys: {
    readonly fylrs: number;
    /** Slots per execserver (there are two). */
    readonly processes: number;
    readonly headroom: number;
    /** Each item runs `sleep JOB_S` on an execserver. */
    readonly JOB_S: number;
    /** Backlogs submitted in setup: key `noisy` (weight 1) and key `heavy` (HEAVY_WEIGHT). */
    readonly NOISY: number;
    readonly HEAVY: number;
    readonly HEAVY_WEIGHT: number;
    /** Quiet tenants, one item at a time each. */
    readonly QUIET: number;
    readonly QUIET_TIMEOUT_S: number;
    readonly DURATION_S: number;
    readonly WARMUP_S: number;
    readonly WINDOW_S: number;
    readonly SHARE_TOLERANCE: number;
    readonly MIN_WINDOW_ITEMS: number;
  };
  readonly fylrChurn: {
    /** Stable fylr-host processes and fylrs in each (fylrs join there too). */
    readonly hosts: number;
    readonly perHost: number;
    /** Fylrs of the host that crashes at CRASH_AT. */
    readonly crashFylrs: number;
    /** Slots per execserver (there are three). */
    readonly processes: number;
    readonly headroom: number;
    /** The fylrs' dispatcher.staleAfter: how long a crashed fylr's claims wait for rescue. */
    readonly staleAfterS: number;
    /** How long the runner waits for the queue to drain after k6. */
    readonly drainTimeoutS: number;
    readonly JOB_S: number;
    /** Items queued and not claimed that the feeder keeps, on top of what the fylrs hold. */
    readonly BACKLOG: number;
    readonly WARMUP_S: number;
    readonly WINDOW_S: number;
    readonly CHURN_S: number;
    readonly CRASH_AT: number;
    readonly JOIN_AT: number;
    readonly LEAVE_AT: number;
    readonly JOIN2_AT: number;
    readonly JOIN_N: number;
    readonly LEAVE_N: number;
    readonly MAX_DEVIATION: number;
    readonly MIN_WINDOW_CLAIMS: number;
    readonly NEWCOMER_MS: number;
  };
}

/** Both profiles. */
export const profiles: Record<ProfileName, Profile> = {
  ci: {
    brokerFairness: {
      processes: 16,
      VUS: 200,
      PROBES: 4,
      DURATION_S: 28,
      WARMUP_S: 10,
      COOLDOWN_S: 3,
      HEADROOM: 4,
      HOLD_MS: 40,
      LATENCY_P95_MS: 20,
    },
    priority: { WORLDS: 2, LOW_STREAMS: 16, HIGH_STREAMS: 3, BACKLOG: 10, DURATION_S: 14, MIN_DECIDED: 200 },
    churn: { STEADY: 20, WAVES: 3, WAVE_VUS: 40, WAVE_S: 8 },
    claimFairness: { fylrs: 4, processes: 8, headroom: 2, JOB_S: 0.5, RATE: 40, SUBMIT_S: 20, DRAIN_TIMEOUT_S: 60 },
    fairnessKeys: {
      fylrs: 3,
      processes: 4,
      headroom: 2,
      JOB_S: 0.5,
      NOISY: 800,
      HEAVY: 600,
      HEAVY_WEIGHT: 3,
      QUIET: 4,
      QUIET_TIMEOUT_S: 15,
      // The quiet tenants run until the share window ends.
      DURATION_S: 25,
      WARMUP_S: 5,
      WINDOW_S: 20,
      SHARE_TOLERANCE: 0.05,
      MIN_WINDOW_ITEMS: 100,
    },
    fylrChurn: {
      hosts: 5,
      perHost: 10,
      crashFylrs: 5,
      processes: 12,
      headroom: 2,
      staleAfterS: 15,
      drainTimeoutS: 60,
      JOB_S: 0.5,
      BACKLOG: 250,
      WARMUP_S: 12,
      WINDOW_S: 30,
      CHURN_S: 72,
      CRASH_AT: 15,
      JOIN_AT: 25,
      LEAVE_AT: 50,
      JOIN2_AT: 60,
      JOIN_N: 5,
      LEAVE_N: 5,
      // With the queue fed apart from the observer and each newcomer followed by its own VU,
      // this 2-core machine with one extra busy core measured deviations of 0.12 and
      // newcomers at full share within 0.7-1.9 s (0.06-0.09 and 0.2-1.4 s without it).
      MAX_DEVIATION: 0.25,
      MIN_WINDOW_CLAIMS: 10,
      NEWCOMER_MS: 4000,
    },
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
    fairnessKeys: {
      fylrs: 4,
      processes: 8,
      headroom: 2,
      JOB_S: 0.5,
      NOISY: 3000,
      HEAVY: 3000,
      HEAVY_WEIGHT: 3,
      QUIET: 8,
      QUIET_TIMEOUT_S: 30,
      DURATION_S: 120,
      WARMUP_S: 15,
      WINDOW_S: 90,
      SHARE_TOLERANCE: 0.05,
      MIN_WINDOW_ITEMS: 1000,
    },
    fylrChurn: {
      hosts: 6,
      perHost: 10,
      crashFylrs: 6,
      processes: 24,
      headroom: 2,
      staleAfterS: 15,
      drainTimeoutS: 120,
      JOB_S: 0.5,
      BACKLOG: 500,
      WARMUP_S: 20,
      WINDOW_S: 30,
      CHURN_S: 200,
      CRASH_AT: 40,
      JOIN_AT: 55,
      LEAVE_AT: 110,
      JOIN2_AT: 125,
      JOIN_N: 6,
      LEAVE_N: 6,
      MAX_DEVIATION: 0.25,
      MIN_WINDOW_CLAIMS: 20,
      NEWCOMER_MS: 4000,
    },
  },
};
