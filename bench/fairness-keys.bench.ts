// fairness-keys: one tenant's backlog against another tenant's single items, at claim time.
// A fylr and a 2-slot execserver (both in this process, talking gRPC over loopback, with a
// real Postgres), jobs are the builtin no-op.
//
//   minority_start_p99_ms   tenant A's backlog of BACKLOG items is queued, then tenant B
//                           submits one item every 500 ms through QueueService; the figure is
//                           B's submit → job start p99. Baseline in the same run: B on an
//                           empty queue. Also reported with keys off (every item on the
//                           default key), which is the oldest-first order of before.
//   keys_jain               10 keys of weight 1, equal backlogs: Jain's index of the items
//                           each key ran while all still had a backlog (slot time: equal jobs).
//   weighted_share_error    a key of weight 3 among three keys of weight 1, equal backlogs:
//                           |observed − configured share| of the items run in that window.
//   claim_rate_one_key      claim + complete of exec items per second, one key (the default),
//                           4 claimers at once, through the keyed claim; baseline the
//                           oldest-first claim statement of before, on the same backlog,
//                           alternating rounds.
//
//   npm run bench -- fairness-keys   FAIRNESS_KEYS_BACKLOG=10000 FAIRNESS_KEYS_MINORITY=20
//                                    FAIRNESS_KEYS_SHARE_ITEMS=2000 FAIRNESS_KEYS_CLAIM_ITEMS=4000
//                                    FAIRNESS_KEYS_CLAIMERS=4
//
// Postgres: DATABASE_URL when set, else an embedded server in a temp dir.
import type pg from "pg";
import { createQueueClient } from "../src/api/index.js";
import { compileFylrConfig, startFylr, type FylrHandle } from "../src/app/index.js";
import type { ExecserverHandle } from "../src/app/execserver.js";
import { QueueStore, type ClaimedItem } from "../src/dispatcher/index.js";
import { itemFromRow, type ItemRow } from "../src/dispatcher/queue/payload.js";
import * as sql from "../src/dispatcher/queue/sql.js";
import { jain, startClaimBench, until } from "./lib/claim-bench.js";
import { emit, percentile } from "./lib/figure.js";

const backlog = Number(process.env.FAIRNESS_KEYS_BACKLOG ?? 10_000);
const minority = Number(process.env.FAIRNESS_KEYS_MINORITY ?? 20);
const shareItems = Number(process.env.FAIRNESS_KEYS_SHARE_ITEMS ?? 2000);
const claimItems = Number(process.env.FAIRNESS_KEYS_CLAIM_ITEMS ?? 4000);
const claimers = Number(process.env.FAIRNESS_KEYS_CLAIMERS ?? 4);
const every = 500;
const slots = 2;

const note = (text: string): void => void process.stderr.write(`fairness-keys: ${text}\n`);
const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));
const poll = { timeoutMs: 600_000, everyMs: 20 };

const noop = JSON.stringify({ calls: [{ service: "noop", args: [], env: {} }] });

async function reset(pool: pg.Pool): Promise<void> {
  await pool.query("TRUNCATE queue_keys, queue_items, fylrs CASCADE");
}

async function startOneFylr(url: string, exec: ExecserverHandle): Promise<FylrHandle> {
  const config = compileFylrConfig(
    { name: "bench", listen: "127.0.0.1:0", databaseUrl: url, databasePoolSize: 6, execserver: { addresses: [exec.grpcAddress] }, dispatcher: { stopGrace: "0s" } },
    "bench",
  );
  const fylr = await startFylr(config);
  await until("the fylr's admission", () => fylr.dispatcher.stats().execAdmission > 0, poll);
  return fylr;
}

/** Job start of finished items, in ms after their submit: finished_at − job duration − created_at. */
async function startDelays(pool: pg.Pool, ids: readonly string[]): Promise<number[]> {
  const r = await pool.query<{ ms: number }>(
    `SELECT extract(epoch FROM finished_at - created_at) * 1000
            - coalesce(rtrim(result -> 'calls' -> 0 -> 'receipt' ->> 'duration', 's')::double precision, 0) * 1000 AS ms
     FROM queue_items WHERE id = ANY($1::uuid[]) AND state = 'succeeded'`,
    [ids],
  );
  return r.rows.map((row) => Number(row.ms)).sort((a, b) => a - b);
}

/** B's submits every 500 ms while A's backlog (if any) drains; returns B's start delays. */
async function minorityRun(url: string, pool: pg.Pool, exec: ExecserverHandle, aBacklog: number, keys: boolean): Promise<number[]> {
  await reset(pool);
  const fylr = await startOneFylr(url, exec);
  try {
    if (aBacklog > 0) {
      await pool.query("INSERT INTO queue_items (kind, priority, payload, fairness_key) SELECT 'exec', 0, $1, $2 FROM generate_series(1, $3)", [
        noop,
        keys ? "A" : "",
        aBacklog,
      ]);
      fylr.dispatcher.poke();
    }
    const client = createQueueClient(fylr.url);
    const ids: string[] = [];
    for (let i = 0; i < minority; i++) {
      const { item } = await client.submit({ calls: [{ service: "noop" }], fairnessKey: keys ? "B" : "" });
      ids.push(item!.id);
      await sleep(every);
    }
    await until("B's items to finish", async () => (await startDelays(pool, ids)).length === ids.length, poll);
    return await startDelays(pool, ids);
  } finally {
    await fylr.forceClose().catch(() => undefined);
  }
}

/** Items run per key while every key still had a backlog: the first `window` items finished. */
async function shareRun(url: string, pool: pg.Pool, exec: ExecserverHandle, weights: Record<string, number>, perKey: number, window: number): Promise<Record<string, number>> {
  await reset(pool);
  for (const [key, weight] of Object.entries(weights)) {
    await pool.query("INSERT INTO queue_items (kind, priority, payload, fairness_key, fairness_weight, start_after) SELECT 'exec', 0, $1, $2, $3, now() + interval '1 hour' FROM generate_series(1, $4)", [
      noop,
      key,
      weight,
      perKey,
    ]);
  }
  const fylr = await startOneFylr(url, exec);
  try {
    await pool.query("UPDATE queue_items SET start_after = now()");
    fylr.dispatcher.poke();
    await until("the window to run", () => fylr.dispatcher.stats().counters.succeeded >= window, poll);
    await fylr.forceClose();
    const r = await pool.query<{ fairness_key: string; n: number }>("SELECT fairness_key, count(*)::int AS n FROM queue_items WHERE state = 'succeeded' GROUP BY fairness_key");
    return Object.fromEntries(Object.keys(weights).map((k) => [k, r.rows.find((row) => row.fairness_key === k)?.n ?? 0]));
  } finally {
    await fylr.forceClose().catch(() => undefined);
  }
}

/** Drains `claimItems` exec items with `claimers` concurrent claimers, each claiming 8 at a time and completing each batch; items/s. */
async function claimRate(pool: pg.Pool, keyed: boolean): Promise<number> {
  await reset(pool);
  await pool.query("INSERT INTO queue_items (kind, priority, payload) SELECT 'exec', 0, $1 FROM generate_series(1, $2)", [noop, claimItems]);
  await pool.query("VACUUM ANALYZE queue_items");
  const queue = new QueueStore(pool);
  for (let c = 0; c < claimers; c++) await queue.registerFylr({ id: `bench-${c}`, hostname: "bench", pid: process.pid });
  const oldest = async (fylr: string): Promise<ClaimedItem[]> =>
    (await pool.query<ItemRow>({ name: "bench-oldest-first", text: sql.claimItems, values: [fylr, "exec", -2_147_483_648, 8] })).rows.map((r) => itemFromRow(r) as ClaimedItem);
  const t0 = performance.now();
  let done = 0;
  await Promise.all(
    Array.from({ length: claimers }, async (_, c) => {
      for (;;) {
        const items = keyed ? await queue.claim(`bench-${c}`, "exec", -2_147_483_648, 8) : await oldest(`bench-${c}`);
        if (items.length === 0) break;
        await queue.completeMany(items.map((item) => ({ fence: item, results: [], output: undefined })));
        done += items.length;
      }
    }),
  );
  return done / ((performance.now() - t0) / 1000);
}

const bench = await startClaimBench("keys", {
  poolSize: 2 * claimers + 2,
  execserver: { instanceId: "bench-keys", waitgroups: { two: { processes: slots } }, services: { noop: { waitgroup: "two", builtin: "noop" } } },
});
try {
  const { url, pool, exec } = bench;

  const empty = await minorityRun(url, pool, exec, 0, true);
  const keyed = await minorityRun(url, pool, exec, backlog, true);
  const fifo = await minorityRun(url, pool, exec, backlog, false);
  const p99 = (s: number[]): number => percentile(s, 99);
  note(`B start p99: empty ${p99(empty).toFixed(1)} ms, keys ${p99(keyed).toFixed(1)} ms, keys off ${p99(fifo).toFixed(1)} ms`);
  const minorityParams = { backlog, minority_items: minority, every_ms: every, slots, job: "builtin noop" };
  emit({ bench: "fairness-keys", metric: "minority_start_p99_ms", value: p99(keyed), baseline: "B alone on an empty queue", baseline_value: p99(empty), params: { ...minorityParams, better: "lower; goal ratio <= 3" } });
  emit({ bench: "fairness-keys", metric: "minority_start_p99_ms keys off", value: p99(fifo), baseline: "B alone on an empty queue", baseline_value: p99(empty), params: { ...minorityParams, better: "reported: oldest first across all items, the order without keys" } });

  const ten = Object.fromEntries(Array.from({ length: 10 }, (_, i) => [`k${i}`, 1]));
  const perKey = Math.ceil(shareItems / 10) * 2;
  const even = await shareRun(url, pool, exec, ten, perKey, shareItems);
  note(`10 keys: ${Object.values(even).join("/")}`);
  emit({ bench: "fairness-keys", metric: "keys_jain", value: jain(Object.values(even)), baseline: "perfectly even", baseline_value: 1, params: { keys: 10, per_key: perKey, window: shareItems, counts: even, better: "higher; goal >= 0.99" } });

  const weights = { heavy: 3, l1: 1, l2: 1, l3: 1 };
  const mixed = await shareRun(url, pool, exec, weights, shareItems, shareItems);
  const total = Object.values(mixed).reduce((a, b) => a + b, 0);
  const share = mixed.heavy! / total;
  note(`weights 3/1/1/1: ${Object.values(mixed).join("/")}`);
  emit({ bench: "fairness-keys", metric: "weighted_share_error", value: Math.abs(share - 0.5), baseline: "configured share 0.5", baseline_value: 0.5, params: { weights, counts: mixed, observed_share: share, better: "lower; goal <= 0.05" } });

  const rates = { keyed: [] as number[], oldest: [] as number[] };
  for (let r = 0; r < 6; r++) {
    for (const mode of r % 2 === 0 ? (["keyed", "oldest"] as const) : (["oldest", "keyed"] as const)) rates[mode].push(await claimRate(pool, mode === "keyed"));
  }
  const median = (v: number[]): number => [...v].sort((a, b) => a - b)[Math.floor((v.length - 1) / 2)]!;
  note(`claims/s one key: keyed ${rates.keyed.map((x) => x.toFixed(0)).join("/")}, oldest-first ${rates.oldest.map((x) => x.toFixed(0)).join("/")}`);
  emit({
    bench: "fairness-keys",
    metric: "claim_rate_one_key",
    value: median(rates.keyed),
    baseline: "oldest-first claim statement (no keys)",
    baseline_value: median(rates.oldest),
    params: { items: claimItems, claimers, batch: 8, rounds: 6, statistic: "median round", better: "higher; goal ratio >= 0.9" },
  });
} finally {
  await bench.close();
}
