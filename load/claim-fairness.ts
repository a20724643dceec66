// claim-fairness: Postgres, two execservers and several real fylr processes; k6 submits
// over the QueueService JSON API (load/scripts/claim-fairness.js). After k6 the runner
// checks the database: every item done exactly once.
import { randomBytes } from "node:crypto";
import pg from "pg";
import { figure } from "./k6.js";
import { profiles } from "./profiles.js";
import type { RunnerCheck, Scenario } from "./scenario.js";
import { startQueueStack, type FylrInfo } from "./servers.js";

// One row per state/attempts/lease combination, and what each fylr finished.
const ITEM_SHAPES = `
  SELECT state, attempts, lease, (error IS NOT NULL) AS has_error, count(*)::int AS n
  FROM queue_items GROUP BY 1, 2, 3, 4 ORDER BY n DESC`;
const PER_FYLR = `SELECT claimed_by, count(*)::int AS n FROM queue_items GROUP BY 1 ORDER BY 1`;

export const claimFairness: Scenario = {
  name: "claim-fairness",
  script: "claim-fairness.js",
  timeoutSeconds: (p) => profiles[p].claimFairness.SUBMIT_S + profiles[p].claimFairness.DRAIN_TIMEOUT_S + 60,
  figures: [
    { label: "items", metric: "items_finished", stat: "value" },
    { label: "claims min", metric: "claims_min", stat: "value" },
    { label: "claims max", metric: "claims_max", stat: "value" },
    { label: "max deviation", metric: "claim_max_deviation", stat: "value", digits: 3 },
    { label: "submit p95 ms", metric: "http_req_duration{scenario:submit}", stat: "p(95)", digits: 1 },
  ],
  async prepare(ctx, profile) {
    const p = profiles[profile].claimFairness;
    const { databaseUrl, fylrs } = await startQueueStack(ctx, "claims", p);
    const { fylrs: _n, processes: _p, headroom: _h, ...env } = p;
    return {
      env: { ...env, FYLR_ADDRS: fylrs.map((f) => f.http).join(","), RUN_ID: randomBytes(4).toString("hex") },
      after: async (summary) => {
        const submitted = figure(summary, "items_submitted", "count") ?? 0;
        const finished = figure(summary, "items_finished", "value") ?? -1;
        return [
          { name: "k6: items finished == items submitted", ok: finished === submitted, detail: `${finished} finished, ${submitted} submitted` },
          ...(await checkDatabase(databaseUrl, fylrs, submitted)),
        ];
      },
    };
  },
};

async function checkDatabase(url: string, fylrs: readonly FylrInfo[], submitted: number): Promise<RunnerCheck[]> {
  const client = new pg.Client(url);
  await client.connect();
  try {
    const shapes = (await client.query<{ state: string; attempts: number; lease: string; has_error: boolean; n: number }>(ITEM_SHAPES)).rows;
    const perFylr = (await client.query<{ claimed_by: string | null; n: number }>(PER_FYLR)).rows;
    const total = shapes.reduce((n, r) => n + r.n, 0);
    const once = shapes.filter((r) => r.state === "succeeded" && r.attempts === 1 && r.lease === "1" && !r.has_error).reduce((n, r) => n + r.n, 0);
    const describe = shapes.map((r) => `${r.n}× ${r.state}/attempts ${r.attempts}/lease ${r.lease}${r.has_error ? "/error" : ""}`).join(", ");
    const known = new Set(fylrs.map((f) => f.id));
    const strangers = perFylr.filter((r) => !r.claimed_by || !known.has(r.claimed_by));
    return [
      { name: "database holds every submitted item, no more", ok: total === submitted && total > 0, detail: `${total} rows, k6 submitted ${submitted}` },
      { name: "every item succeeded once (attempts 1, lease 1, no error)", ok: once === total && total > 0, detail: describe || "no rows" },
      {
        name: "every item finished by one of the fylrs",
        ok: strangers.length === 0,
        detail: perFylr.map((r) => `${r.claimed_by ?? "nobody"}=${r.n}`).join(" "),
      },
    ];
  } finally {
    await client.end();
  }
}
