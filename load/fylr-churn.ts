// fylr-churn: Postgres, three execservers and many real fylrs, several per fylr-host
// process (load/fylr-host.ts); k6 (load/scripts/fylr-churn.js) keeps the queue topped up,
// crashes one host, starts and stops fylrs, and judges claim fairness per window. After
// k6 the runner waits for the queue to drain and checks the database: every item
// succeeded, none failed, nothing is left held.
import { randomBytes } from "node:crypto";
import { join } from "node:path";
import { writeFileSync } from "node:fs";
import pg from "pg";
import type { FylrConfigInput } from "../src/app/index.js";
import { sleep } from "../src/shared/abort.js";
import { profiles } from "./profiles.js";
import type { RunnerCheck, Scenario } from "./scenario.js";
import { freshDatabase, startExecserverProcess, type ServerContext } from "./servers.js";
import { nodeScript } from "../harness/node-children.js";

const ITEM_SHAPES = `
  SELECT state, (lease > 1) AS again, (error IS NOT NULL) AS has_error, count(*)::int AS n
  FROM queue_items GROUP BY 1, 2, 3 ORDER BY n DESC`;
const ERRORS = `SELECT left(error, 160) AS error, count(*)::int AS n FROM queue_items WHERE error IS NOT NULL GROUP BY 1 ORDER BY 2 DESC LIMIT 4`;
const UNFINISHED = `SELECT count(*)::int AS n FROM queue_items WHERE state IN ('queued', 'claimed', 'running')`;

/** Starts one fylr-host process running `fylrs` fylrs; resolves with its control address. */
async function startFylrHost(ctx: ServerContext, name: string, fylrs: number, fylr: Omit<FylrConfigInput, "name" | "listen">, greedyHeadroom?: number): Promise<string> {
  const path = join(ctx.sup.tempDir(name), "host.json");
  writeFileSync(path, JSON.stringify({ name, fylrs, fylr, greedyHeadroom }));
  const started = await ctx.sup.start(
    name,
    process.execPath,
    [...nodeScript(join(ctx.serverRoot, "load", "fylr-host.ts")), path],
    /^fylr-host listening control=(\S+)$/m,
    { cwd: ctx.serverRoot, env: { SLOTBROKER_LOG_LEVEL: process.env.SLOTBROKER_LOAD_LOG_LEVEL ?? "warn" }, timeoutMs: 120_000 },
  );
  return started.banner[1]!;
}

export const fylrChurn: Scenario = {
  name: "fylr-churn",
  script: "fylr-churn.js",
  timeoutSeconds: (p) => profiles[p].fylrChurn.CHURN_S + 90,
  figures: [
    { label: "fylrs min", metric: "fylrs_present", stat: "min" },
    { label: "windows", metric: "windows", stat: "count" },
    { label: "max deviation", metric: "window_max_deviation", stat: "max", digits: 3 },
    { label: "min claims", metric: "window_claims_min", stat: "min" },
    { label: "rescue ms", metric: "rescue_ms", stat: "max" },
    { label: "rescued", metric: "rescued_items", stat: "count" },
    { label: "newcomer share ms", metric: "newcomer_share_ms", stat: "max" },
  ],
  async prepare(ctx, profile) {
    const p = profiles[profile].fylrChurn;
    const [databaseUrl, execs] = await Promise.all([
      freshDatabase(ctx),
      Promise.all(
        ["a", "b", "c"].map((name) =>
          startExecserverProcess(ctx, `exec-churn-${name}`, {
            instanceId: `load-churn-${name}`,
            // 55 fylrs in 6 processes on 2 shared cores may take seconds to answer an OFFER;
            // the default 5 s would expire offers and measure starvation, not fairness.
            offerTimeout: "30s",
            waitgroups: { work: { processes: p.processes } },
            services: { sleep: { waitgroup: "work", command: ["sleep"], timeout: "1m" } },
          }),
        ),
      ),
    ]);
    const fylr: Omit<FylrConfigInput, "name" | "listen"> = {
      databaseUrl,
      // Two per fylr (the least allowed), plus its heartbeat and LISTEN connections: the
      // runner's Postgres allows 500 (see servers.ts).
      databasePoolSize: 2,
      // One stream per execserver: each address is one instance, and the execservers take
      // turns per connection, so a fylr whose pool grew would get more turns than the rest.
      // A want may wait long in this crowd: a short connectTimeout would give items back.
      execserver: { addresses: execs.map((e) => e.grpc), maxConnectionsPerAddress: 1, connectTimeout: "5m" },
      dispatcher: { headroom: p.headroom, stopGrace: "2s", heartbeatInterval: "1s", staleAfter: `${p.staleAfterS}s` },
    };
    // All at once: the migrations' advisory lock lets one fylr migrate while the rest wait.
    const [crashHost, ...hosts] = await Promise.all([
      startFylrHost(ctx, "host-crash", p.crashFylrs, fylr),
      ...Array.from({ length: p.hosts }, (_, i) => startFylrHost(ctx, `host-${i}`, p.perHost, fylr, i === 0 ? greedyHeadroom() : undefined)),
    ]);
    const { processes: _p, headroom: _h, hosts: _n, perHost: _ph, crashFylrs: _c, staleAfterS: _s, drainTimeoutS, ...env } = p;
    return {
      env: {
        ...env,
        HOST_ADDRS: hosts.join(","),
        CRASH_HOST: crashHost,
        EXECSERVERS: execs.length,
        EXEC_ADDRS: execs.map((e) => e.grpc).join(","),
        // SLOTBROKER_LOAD_DIAG=1: per-fylr grants, declines and parked wants in the log.
        DIAG: process.env.SLOTBROKER_LOAD_DIAG ?? "0",
        GREEDY: greedyHeadroom() === undefined ? "0" : "1",
        MIN_FYLRS: p.hosts * p.perHost,
        RESCUE_MS: (p.staleAfterS + 5) * 1000,
        RUN_ID: randomBytes(4).toString("hex"),
      },
      after: () => checkDatabase(databaseUrl, drainTimeoutS),
    };
  },
};

// SLOTBROKER_LOAD_BREAK=greedy: one fylr ignores the claim share (headroom 1000 instead of
// the profile's), to see the fairness thresholds fail. Never set in CI.
function greedyHeadroom(): number | undefined {
  const mode = process.env.SLOTBROKER_LOAD_BREAK;
  if (mode === undefined || mode === "") return undefined;
  if (mode !== "greedy") throw new Error(`SLOTBROKER_LOAD_BREAK=${mode}: the only break is "greedy"`);
  return 1000;
}

async function checkDatabase(url: string, drainTimeoutS: number): Promise<RunnerCheck[]> {
  const client = new pg.Client(url);
  await client.connect();
  try {
    const deadline = Date.now() + drainTimeoutS * 1000;
    let unfinished = -1;
    while (Date.now() < deadline) {
      unfinished = (await client.query<{ n: number }>(UNFINISHED)).rows[0]!.n;
      if (unfinished === 0) break;
      await sleep(500);
    }
    const shapes = (await client.query<{ state: string; again: boolean; has_error: boolean; n: number }>(ITEM_SHAPES)).rows;
    const total = shapes.reduce((n, r) => n + r.n, 0);
    const succeeded = shapes.filter((r) => r.state === "succeeded").reduce((n, r) => n + r.n, 0);
    const errors = (await client.query<{ error: string; n: number }>(ERRORS)).rows.map((r) => `${r.n}× "${r.error}"`).join("; ");
    const describe = shapes.map((r) => `${r.n}× ${r.state}${r.again ? "/claimed again" : ""}${r.has_error ? "/error" : ""}`).join(", ");
    return [
      { name: `queue drained within ${drainTimeoutS} s`, ok: unfinished === 0, detail: `${unfinished} items queued, claimed or running` },
      { name: "every item succeeded (rescued ones on a later claim)", ok: total > 0 && succeeded === total, detail: `${describe || "no rows"}${errors ? `; errors: ${errors}` : ""}` },
    ];
  } finally {
    await client.end();
  }
}
