// fairness-keys: Postgres, two execservers and several real fylr processes; a noisy tenant
// and a weight-3 tenant hold large backlogs while quiet tenants submit one item at a time,
// all over the QueueService JSON API (load/scripts/fairness-keys.js). k6's thresholds bound
// each quiet tenant's submit → job start latency and the weighted tenant's share.
import { randomBytes } from "node:crypto";
import pg from "pg";
import { profiles } from "./profiles.js";
import type { RunnerCheck, Scenario } from "./scenario.js";
import { startQueueStack } from "./servers.js";

const FAILED = `SELECT count(*)::int AS n FROM queue_items WHERE state IN ('failed', 'cancelled')`;

export const fairnessKeys: Scenario = {
  name: "fairness-keys",
  script: "fairness-keys.js",
  timeoutSeconds: (p) => profiles[p].fairnessKeys.DURATION_S + 120,
  figures: [
    { label: "quiet items", metric: "quiet_start_ms", stat: "count" },
    { label: "quiet start p99 ms", metric: "quiet_start_ms", stat: "p(99)" },
    { label: "bound ms", metric: "quiet_start_bound_ms", stat: "value" },
    { label: "weighted share", metric: "weighted_share", stat: "value", digits: 3 },
    { label: "share error", metric: "weighted_share_error", stat: "value", digits: 3 },
  ],
  async prepare(ctx, profile) {
    const p = profiles[profile].fairnessKeys;
    const { databaseUrl, fylrs } = await startQueueStack(ctx, "keys", p);
    const { fylrs: _n, processes: _p, headroom: _h, ...env } = p;
    return {
      env: {
        ...env,
        SLOTS: 2 * p.processes,
        FYLRS: p.fylrs,
        KEYS: keysMode(),
        FYLR_ADDRS: fylrs.map((f) => f.http).join(","),
        RUN_ID: randomBytes(4).toString("hex"),
      },
      after: () => checkDatabase(databaseUrl),
    };
  },
};

// SLOTBROKER_LOAD_BREAK=nokeys: every item is submitted without a key or weight, so the
// claim order is today's FIFO within a priority, to see the thresholds fail. Never set in CI.
function keysMode(): "on" | "off" {
  const mode = process.env.SLOTBROKER_LOAD_BREAK;
  if (mode === undefined || mode === "") return "on";
  if (mode !== "nokeys") throw new Error(`SLOTBROKER_LOAD_BREAK=${mode}: the only break of fairness-keys is "nokeys"`);
  return "off";
}

// The backlogs are still queued when k6 ends (the servers stop with them); what ran must
// have succeeded.
async function checkDatabase(url: string): Promise<RunnerCheck[]> {
  const client = new pg.Client(url);
  await client.connect();
  try {
    const failed = (await client.query<{ n: number }>(FAILED)).rows[0]!.n;
    return [{ name: "no item failed or was cancelled", ok: failed === 0, detail: `${failed} failed or cancelled` }];
  } finally {
    await client.end();
  }
}
