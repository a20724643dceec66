// wakeup: how soon an item submitted on one fylr is claimed by another. Two dispatchers on
// one database, each with its own pool: A submits (it has no exec capacity, so it never
// claims), B has the capacity and claims. Timed from the call to A.submit to B's
// "item:claimed" event for that item; p50 and p99. The next submit waits for B's claim,
// plus a random pause of 0–1 s (one poll interval) in both modes, so submits land at
// random points of B's poll cycle (without it every submit would come just after B's pass
// for the previous item, the worst case for polling).
//
// Two modes, alternating in blocks in the same run:
//   notify     the default: B LISTENs, the queue's trigger NOTIFYs, B's loop wakes at once
//   poll-only  the baseline: dispatcher.listen = false, only B's 1 s poll finds the item
// Goal: ratio (notify ÷ poll-only) ≤ 0.05 for p50 and p99. Also reported: the same from
// the moment A's submit returned (the row is committed) to B's claim — the wakeup path
// alone, without the INSERT, which is what a loaded database makes slow. The notes split
// the notify path at B's wakeup (the notification's way, then B's claim query) and give the
// round trip of a bare `SELECT 1` on B's pool between items, for comparison.
//
//   npm run bench -- wakeup            WAKEUP_ITEMS=120 (notify) WAKEUP_POLL_ITEMS=60 WAKEUP_ROUNDS=3
//
// Postgres: DATABASE_URL when set, else an embedded server in a temp dir.
import { randomBytes } from "node:crypto";
import { chmodSync, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { create } from "@bufbuild/protobuf";
import pg from "pg";
import { ReceiptSchema } from "../gen/slotbroker/v1/broker_pb.js";
import { Dispatcher, ManualCapacitySource, migrate, type ExecBackend } from "../src/dispatcher/index.js";
import { startEmbeddedPostgres, type LocalPostgres } from "../src/shared/embedded-postgres.js";
import { createPgPool } from "../src/shared/postgres.js";
import { emit, percentile } from "./lib/figure.js";

const notifyItems = Number(process.env.WAKEUP_ITEMS ?? 120);
const pollItems = Number(process.env.WAKEUP_POLL_ITEMS ?? 60);
const rounds = Number(process.env.WAKEUP_ROUNDS ?? 3);
const pollIntervalMs = 1000;

const note = (text: string): void => void process.stderr.write(`wakeup: ${text}\n`);
const done: ExecBackend = { run: () => Promise.resolve({ receipt: create(ReceiptSchema, { exitCode: 0 }), stdout: Buffer.alloc(0) }) };
const instance = { instanceId: "exec-bench", address: "127.0.0.1:1", capacity: 64, clients: 1 };

interface Sample {
  /** Call of A.submit → B's claim. */
  readonly total: number;
  /** A.submit returned (committed) → B's claim. */
  readonly afterCommit: number;
  /** A's commit → B's loop woken (the notification's way), and B woken → its claim returned (one claim query). */
  readonly toWake: number;
  readonly wakeToClaim: number;
}

// Where the time goes, for the notes: B's pool answering `SELECT 1` between items.
const roundTrips: number[] = [];

// Submit-to-claim latencies (ms) of `n` items, one at a time.
async function measure(url: string, listen: boolean, n: number): Promise<Sample[]> {
  const pools = [createPgPool({ connectionString: url, max: 4 }), createPgPool({ connectionString: url, max: 4 })];
  const config = { listen, pollIntervalMs, heartbeatIntervalMs: 1000, staleAfterMs: 60_000 };
  const a = new Dispatcher({ pool: pools[0]!, capacity: new ManualCapacitySource(), backend: done, migrate: false, config });
  const b = new Dispatcher({ pool: pools[1]!, capacity: new ManualCapacitySource([instance]), backend: done, migrate: false, config });
  const claimedAt = new Map<string, number>();
  const wokenBefore = new Map<string, number>();
  let lastWakeAt = 0;
  let waiting: { id: string; resolve: () => void } | undefined;
  b.events.on("wakeup", () => (lastWakeAt = performance.now()));
  b.events.on("item:claimed", (item) => {
    claimedAt.set(item.id, performance.now());
    wokenBefore.set(item.id, lastWakeAt);
    if (waiting?.id === item.id) waiting.resolve();
  });
  try {
    await a.start();
    await b.start();
    if (listen) {
      for (const d of [a, b]) if (!d.listening) await d.events.next("notify:up");
    }
    const samples: Sample[] = [];
    for (let i = 0; i < n; i++) {
      const pause = new Promise((r) => setTimeout(r, Math.random() * pollIntervalMs));
      if (listen) {
        const sent = performance.now();
        await pools[1]!.query("SELECT 1");
        roundTrips.push(performance.now() - sent);
      }
      await pause;
      const started = performance.now();
      const { item } = await a.submit({ calls: [{ service: "noop", args: [], env: {} }] });
      const committed = performance.now();
      if (!claimedAt.has(item.id)) await new Promise<void>((resolve) => (waiting = { id: item.id, resolve }));
      const claimed = claimedAt.get(item.id)!;
      const woken = wokenBefore.get(item.id)!;
      samples.push({ total: claimed - started, afterCommit: Math.max(0, claimed - committed), toWake: Math.max(0, woken - committed), wakeToClaim: claimed - woken });
    }
    return samples;
  } finally {
    await a.stop({ graceMs: 1000 });
    await b.stop({ graceMs: 1000 });
    for (const pool of pools) await pool.end();
  }
}

let dataRoot: string | undefined;
let server: LocalPostgres | undefined;
let adminUrl = process.env.DATABASE_URL;
if (!adminUrl) {
  dataRoot = mkdtempSync(join(tmpdir(), "slotbroker-bench-wakeup-"));
  chmodSync(dataRoot, 0o755); // as root the server runs as the "postgres" user
  server = await startEmbeddedPostgres({ dataDir: join(dataRoot, "data"), persistent: false });
  adminUrl = server.url;
}
const admin = new pg.Client(adminUrl);
await admin.connect();
const db = `bench_wakeup_${randomBytes(4).toString("hex")}`;
const url = new URL(adminUrl);
url.pathname = `/${db}`;
try {
  await admin.query(`CREATE DATABASE ${db}`);
  await migrate(url.toString());
  const samples = { notify: [] as Sample[], poll: [] as Sample[] };
  note("warm-up");
  await measure(url.toString(), true, 5);
  for (let r = 0; r < rounds; r++) {
    // Alternate which mode goes first, so drift on the machine hits both alike.
    const order = r % 2 === 0 ? (["notify", "poll"] as const) : (["poll", "notify"] as const);
    for (const mode of order) {
      const n = Math.ceil((mode === "notify" ? notifyItems : pollItems) / rounds);
      const got = await measure(url.toString(), mode === "notify", n);
      samples[mode].push(...got);
      const sorted = got.map((s) => s.total).sort((x, y) => x - y);
      note(`round ${r + 1}: ${mode} p50 ${percentile(sorted, 50).toFixed(1)} ms, p99 ${percentile(sorted, 99).toFixed(1)} ms (${n} items)`);
    }
  }
  const sorted = (list: Sample[], key: keyof Sample): number[] => list.map((s) => s[key]).sort((x, y) => x - y);
  const spread = (values: number[]): string => {
    const v = [...values].sort((x, y) => x - y);
    return `p50 ${percentile(v, 50).toFixed(1)} ms, p99 ${percentile(v, 99).toFixed(1)} ms`;
  };
  note(`notify: A's commit → B woken ${spread(sorted(samples.notify, "toWake"))}; B woken → claim returned ${spread(sorted(samples.notify, "wakeToClaim"))}`);
  note(`SELECT 1 on B's pool between items: ${spread(roundTrips)} (${roundTrips.length} samples)`);
  const params = { notify_items: samples.notify.length, poll_items: samples.poll.length, poll_interval_ms: pollIntervalMs, rounds, better: "lower ratio" };
  const baseline = `poll only (${pollIntervalMs} ms poll, no LISTEN)`;
  for (const [key, suffix, goal] of [["total", "", "<= 0.05"], ["afterCommit", "_after_commit", undefined]] as const) {
    const notify = sorted(samples.notify, key);
    const poll = sorted(samples.poll, key);
    for (const [metric, p] of [[`p50${suffix}_ms`, 50], [`p99${suffix}_ms`, 99]] as const) {
      emit({ bench: "wakeup", metric, value: percentile(notify, p), baseline, baseline_value: percentile(poll, p), params: goal ? { ...params, goal } : params });
    }
  }
} finally {
  await admin.query(`DROP DATABASE IF EXISTS ${db} WITH (FORCE)`).catch(() => undefined);
  await admin.end();
  await server?.stop();
  if (dataRoot) rmSync(dataRoot, { recursive: true, force: true });
}
