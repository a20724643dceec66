// The load scenarios: what each starts, what it passes to its k6 script, and the figures
// the runner's table shows. Sizes come from the profile (load/profiles.ts).
import { claimFairness } from "./claim-fairness.js";
import { fairnessKeys } from "./fairness-keys.js";
import { fylrChurn } from "./fylr-churn.js";
import { childrenOf, describeProcess } from "./processes.js";
import { profiles } from "./profiles.js";
import type { Scenario } from "./scenario.js";
import { startExecserverProcess } from "./servers.js";

const brokerFairness: Scenario = {
  name: "broker-fairness",
  script: "broker-fairness.js",
  timeoutSeconds: (p) => profiles[p].brokerFairness.DURATION_S + 90,
  figures: [
    { label: "jain", metric: "fairness_jain", stat: "value", digits: 4 },
    { label: "conns", metric: "fairness_connections", stat: "value" },
    { label: "grants/s", metric: "window_grants_per_s", stat: "value" },
    { label: "idle grant p95 ms", metric: "grant_latency_idle_ms", stat: "p(95)", digits: 1 },
    { label: "protocol errors", metric: "protocol_errors", stat: "count" },
  ],
  async prepare(ctx, profile) {
    const p = profiles[profile].brokerFairness;
    const exec = await startExecserverProcess(ctx, "exec-fairness", {
      instanceId: "load-fairness",
      waitgroups: { fair: { processes: p.processes }, probe: { processes: p.PROBES } },
      services: { noop: { waitgroup: "fair", builtin: "noop" }, probe: { waitgroup: "probe", builtin: "noop" } },
    });
    const { processes: _processes, ...env } = p;
    return { env: { ...env, EXEC_ADDR: exec.grpc } };
  },
};

const priority: Scenario = {
  name: "priority",
  script: "priority.js",
  timeoutSeconds: (p) => profiles[p].priority.DURATION_S + 60,
  figures: [
    { label: "inversions", metric: "priority_inversions", stat: "count" },
    { label: "decided", metric: "priority_decided", stat: "count" },
    { label: "urgent offers", metric: "urgent_offers", stat: "count" },
    { label: "backlog offers", metric: "backlog_offers", stat: "count" },
    { label: "urgent wait p95 ms", metric: "urgent_want_wait_ms", stat: "p(95)", digits: 1 },
  ],
  async prepare(ctx, profile) {
    const p = profiles[profile].priority;
    const waitgroups: Record<string, { processes: number }> = {};
    const services: Record<string, { waitgroup: string; builtin: "noop" }> = {};
    for (let w = 0; w < p.WORLDS; w++) {
      waitgroups[`prio-${w}`] = { processes: 1 };
      services[`prio-${w}`] = { waitgroup: `prio-${w}`, builtin: "noop" };
    }
    const exec = await startExecserverProcess(ctx, "exec-priority", { instanceId: "load-priority", waitgroups, services });
    return { env: { ...p, EXEC_ADDR: exec.grpc } };
  },
};

const churn: Scenario = {
  name: "churn",
  script: "churn.js",
  timeoutSeconds: (p) => profiles[p].churn.WAVES * profiles[p].churn.WAVE_S + 90,
  figures: [
    { label: "churned conns", metric: "churn_connections", stat: "count" },
    { label: "hoarded offers", metric: "churn_hoarded_offers", stat: "count" },
    { label: "killed jobs", metric: "churn_slow_jobs_started", stat: "count" },
    { label: "steady served/s", metric: "steady_served_each_second", stat: "value", digits: 3 },
    { label: "steady wait p95 ms", metric: "steady_want_wait_ms", stat: "p(95)" },
    { label: "leftover", metric: "leftover_running", stat: "count" },
  ],
  async prepare(ctx, profile) {
    const p = profiles[profile].churn;
    const exec = await startExecserverProcess(ctx, "exec-churn", {
      instanceId: "load-churn",
      // Longer than the whole run: a hoarded OFFER can only come back through the drop.
      offerTimeout: "10m",
      waitgroups: { fast: { processes: 8 }, hoard: { processes: 2 }, slow: { processes: 2 } },
      services: {
        fast: { waitgroup: "fast", builtin: "noop" },
        hoard: { waitgroup: "hoard", builtin: "noop" },
        slow: { waitgroup: "slow", command: ["sleep"], timeout: "10m" },
      },
    });
    return {
      env: { ...p, EXEC_ADDR: exec.grpc },
      // The execserver says running 0; make sure the `sleep` processes are really gone too.
      after: () => {
        const left = childrenOf(exec.pid, "sleep");
        return Promise.resolve([
          { name: "no `sleep` job processes left under the execserver", ok: left.length === 0, detail: left.length ? left.map(describeProcess).join("; ") : "none" },
        ]);
      },
    };
  },
};

/** Every scenario, in the order `npm run load` runs them. */
export const scenarios: readonly Scenario[] = [brokerFairness, priority, churn, claimFairness, fairnessKeys, fylrChurn];
