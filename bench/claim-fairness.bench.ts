// claim-fairness: 5 fylrs (full in-process fylrs: dispatcher, broker connections, pipes),
// one database, one 40-slot execserver. Counts the claims of each fylr while they drain a
// backlog together; the figure is max/min claims per fylr (1.0 is perfectly even). The
// baseline, in the same run, is greedy claiming with no share: the same fylrs with a
// headroom of 1000, so admission never binds and each pass claims a full batch.
//
//   npm run bench -- claim-fairness     CLAIM_FAIRNESS_ITEMS=600 CLAIM_FAIRNESS_JOB=0.25
//                                       CLAIM_FAIRNESS_ROUNDS=2
//
// The backlog is inserted in one statement once every fylr sees all five clients, so no
// fylr gets a head start. Jobs are `sleep JOB` (seconds) on the execserver. Rounds
// alternate the order of the two modes; figures are the median round.
//
// Postgres: DATABASE_URL when set, else an embedded server in a temp dir.
import type pg from "pg";
import { compileFylrConfig, startFylr, type FylrHandle } from "../src/app/index.js";
import type { ExecserverHandle } from "../src/app/execserver.js";
import { jain, startClaimBench, until } from "./lib/claim-bench.js";
import { emit } from "./lib/figure.js";

const items = Number(process.env.CLAIM_FAIRNESS_ITEMS ?? 600);
const job = process.env.CLAIM_FAIRNESS_JOB ?? "0.25";
const rounds = Number(process.env.CLAIM_FAIRNESS_ROUNDS ?? 2);
const fylrCount = 5;
const slots = 40;

const note = (text: string): void => void process.stderr.write(`claim-fairness: ${text}\n`);
const poll = { timeoutMs: 120_000, everyMs: 10 };

interface Round {
  readonly claims: number[];
  /** The most exec items one fylr held at once. */
  readonly maxHeld: number;
  readonly seconds: number;
}

async function round(url: string, exec: ExecserverHandle, headroom: number, pool: pg.Pool): Promise<Round> {
  await pool.query("TRUNCATE queue_items, fylrs CASCADE");
  const fylrs: FylrHandle[] = [];
  try {
    for (let i = 0; i < fylrCount; i++) {
      const config = compileFylrConfig(
        {
          name: `f${i}`,
          listen: "127.0.0.1:0",
          databaseUrl: url,
          databasePoolSize: 4,
          execserver: { addresses: [exec.grpcAddress] },
          dispatcher: { headroom, stopGrace: "0s" },
        },
        "bench",
      );
      fylrs.push(await startFylr(config));
    }
    const share = Math.ceil(slots / fylrCount) + headroom;
    await until("every fylr to see all five clients", () => fylrs.every((f) => f.dispatcher.stats().execAdmission === share), poll);
    const payload = JSON.stringify({ calls: [{ service: "sleep", args: [job], env: {} }] });
    let maxHeld = 0;
    const sampler = setInterval(() => {
      for (const f of fylrs) maxHeld = Math.max(maxHeld, f.dispatcher.stats().execHeld);
    }, 5);
    const t0 = performance.now();
    await pool.query("INSERT INTO queue_items (kind, priority, payload) SELECT 'exec', 0, $1 FROM generate_series(1, $2)", [payload, items]);
    for (const f of fylrs) f.dispatcher.poke();
    await until("the backlog to drain", () => fylrs.reduce((n, f) => n + f.dispatcher.stats().counters.succeeded, 0) >= items, poll);
    const seconds = (performance.now() - t0) / 1000;
    clearInterval(sampler);
    return { claims: fylrs.map((f) => f.dispatcher.stats().counters.claimed), maxHeld, seconds };
  } finally {
    for (const f of fylrs) await f.forceClose().catch(() => undefined);
  }
}

/** max/min; a fylr with no claims at all counts as 1 so the ratio stays finite. */
function maxMin(claims: readonly number[]): number {
  return Math.max(...claims) / Math.max(1, Math.min(...claims));
}

function median(values: number[]): number {
  const sorted = [...values].sort((a, b) => a - b);
  return sorted[Math.floor((sorted.length - 1) / 2)]!;
}

const bench = await startClaimBench("fair", {
  poolSize: 2,
  execserver: { instanceId: "bench-40", waitgroups: { forty: { processes: slots } }, services: { sleep: { waitgroup: "forty", command: ["sleep"] } } },
});
try {
  const { url, pool, exec } = bench;
  const modes = { share: { headroom: 2, rounds: [] as Round[] }, greedy: { headroom: 1000, rounds: [] as Round[] } };
  for (let r = 0; r < rounds; r++) {
    const order = r % 2 === 0 ? (["share", "greedy"] as const) : (["greedy", "share"] as const);
    for (const mode of order) {
      const result = await round(url, exec, modes[mode].headroom, pool);
      modes[mode].rounds.push(result);
      note(`round ${r + 1} ${mode}: claims ${result.claims.join("/")}, max held ${result.maxHeld}, ${result.seconds.toFixed(1)} s`);
    }
  }
  const figure = (mode: keyof typeof modes, f: (r: Round) => number): number => median(modes[mode].rounds.map(f));
  const params = {
    fylrs: fylrCount,
    slots,
    items,
    job: `sleep ${job}`,
    rounds,
    statistic: "median round",
    claims_share: modes.share.rounds.map((r) => r.claims),
    claims_greedy: modes.greedy.rounds.map((r) => r.claims),
  };
  const baseline = "greedy claiming, no share (headroom 1000)";
  emit({ bench: "claim-fairness", metric: "max_min_claims", value: figure("share", (r) => maxMin(r.claims)), baseline, baseline_value: figure("greedy", (r) => maxMin(r.claims)), params: { ...params, better: "lower; goal <= 1.2" } });
  emit({ bench: "claim-fairness", metric: "jain_index", value: figure("share", (r) => jain(r.claims)), baseline, baseline_value: figure("greedy", (r) => jain(r.claims)), params: { ...params, better: "higher; 1.0 is even" } });
  emit({ bench: "claim-fairness", metric: "max_held_per_fylr", value: figure("share", (r) => r.maxHeld), baseline, baseline_value: figure("greedy", (r) => r.maxHeld), params: { fylrs: fylrCount, slots, items, better: "share caps it at ceil(40/5)+2 = 10" } });
  emit({ bench: "claim-fairness", metric: "drain_seconds", value: figure("share", (r) => r.seconds), baseline, baseline_value: figure("greedy", (r) => r.seconds), params: { fylrs: fylrCount, slots, items, job: `sleep ${job}`, better: "lower (the share must not cost throughput)" } });
} finally {
  await bench.close();
}
