// The must-shows with real processes: `slotbroker fylr` children sharing one
// Postgres and a real `slotbroker execserver` child. (The lease fence itself — a late
// completion by a presumed-dead owner refused — is pinned in test/dispatcher/store.test.ts
// and test/dispatcher/fleet.test.ts; the kill test below only re-checks it end to end.)
import { timestampFromDate } from "@bufbuild/protobuf/wkt";
import { expect } from "chai";
import type pg from "pg";
import { ItemState } from "../../gen/slotbroker/v1/queue_pb.js";
import { inlineOutput, QueueStore } from "../../src/dispatcher/index.js";
import { spawnExecserver, waitFor, type ExecserverProcess } from "../../harness/execserver-process.js";
import { createTestDatabase } from "../support/postgres.js";
import { closeAll, fastFylrConfig, openPool, spawnFylr, type FylrProcess } from "./support.js";

type Held = Record<string, number>;

async function heldByFylr(pool: pg.Pool): Promise<Held> {
  const r = await pool.query<{ claimed_by: string; n: number }>(
    "SELECT claimed_by, count(*)::int AS n FROM queue_items WHERE state IN ('claimed', 'running') GROUP BY claimed_by",
  );
  return Object.fromEntries(r.rows.map((row) => [row.claimed_by, row.n]));
}

async function countByState(pool: pg.Pool): Promise<Record<string, number>> {
  const r = await pool.query<{ state: string; n: number }>("SELECT state, count(*)::int AS n FROM queue_items GROUP BY state");
  return Object.fromEntries(r.rows.map((row) => [row.state, row.n]));
}

describe("fylr processes sharing one queue and one execserver", () => {
  let databaseUrl: string;
  let pool: pg.Pool;
  let exec: ExecserverProcess | undefined;
  let fylrs: FylrProcess[] = [];

  before(async () => {
    databaseUrl = await createTestDatabase("fleet_proc");
  });
  beforeEach(async () => {
    pool = openPool(databaseUrl);
    // The first fylr migrates; until then there is nothing to truncate.
    // The whole schema: migrations create functions and triggers too, not only tables.
    await pool.query("DROP SCHEMA public CASCADE; CREATE SCHEMA public");
  });
  afterEach(async () => {
    await closeAll(...fylrs, exec, pool);
    fylrs = [];
    exec = undefined;
  });

  const startFylrs = async (n: number, extra: Parameters<typeof fastFylrConfig>[2] = {}): Promise<FylrProcess[]> => {
    // One at a time: concurrent first starts would all migrate (safe, but slower on 2 cores).
    // Generous liveness timeouts: these tests count claims and runs, and on a machine at load
    // 30 a fylr's stream to the live execserver was dropped once in five runs (its running
    // jobs cancelled and retried under a new lease); the Ping (5 s) and keepalive (20 s)
    // timeouts are what drop a stream whose peer is merely slow. Half-open detection has
    // tests of its own.
    const liveness = { execserver: { addresses: [exec!.grpcAddress], pingTimeout: "30s", keepaliveTimeout: "60s", ...extra.execserver } };
    for (let i = 0; i < n; i++) fylrs.push(await spawnFylr(fastFylrConfig(databaseUrl, [exec!.grpcAddress], { ...extra, ...liveness }), `f${fylrs.length}`));
    return fylrs.slice(-n);
  };

  it("several fylrs claim concurrently and every item is claimed and run exactly once", async function () {
    this.timeout(120_000);
    // offerTimeout 30 s: at load 30 a fylr's JOB once came after the default 5 s, the offer was
    // stale and the attempt retried under a new lease (the job never ran twice, but the
    // lease count this test reads went to 2).
    exec = await spawnExecserver({
      instanceId: "exec-noop",
      offerTimeout: "30s",
      waitgroups: { bench: { processes: 40 } },
      services: { noop: { waitgroup: "bench", builtin: "noop" } },
    });
    // staleAfter 10 s: at load 36 on two cores one fylr process went without CPU for over
    // the default test threshold (2 s) and was rightly declared dead; this test counts
    // claims between live fylrs (the takeover has its own test below).
    const team = await startFylrs(4, { dispatcher: { staleAfter: "10s" } });
    await waitFor("4 fylrs connected", async () => (await exec!.status()).connections.length >= 4);
    const total = 300;
    await Promise.all(
      Array.from({ length: total }, (_, i) => team[i % team.length]!.client.submit({ calls: [{ service: "noop", args: [String(i)] }] })),
    );
    await waitFor("every item to finish", async () => (await countByState(pool)).succeeded === total, 60_000, 200);
    const rows = await pool.query<{ id: string; lease: string; attempts: number; claimed_by: string; error: string | null }>("SELECT id, lease, attempts, claimed_by, error FROM queue_items");
    // The lease is bumped by every claim: 1 everywhere means nobody claimed an item twice.
    const twice = rows.rows.filter((r) => Number(r.lease) !== 1 || r.attempts !== 1);
    const warnings = team.flatMap((f) => f.stderr().split("\n").filter((line) => /"level":(40|50)/.test(line)).map((line) => `${f.id}: ${line}`));
    expect(twice, `claimed more than once:\n${warnings.join("\n")}`).to.deep.equal([]);
    const claimed = await Promise.all(team.map(async (f) => Number((await f.client.stats({})).claimedTotal)));
    expect(claimed.reduce((a, b) => a + b, 0)).to.equal(total);
    expect(claimed.every((n) => n > 0), `claims per fylr: ${claimed.join(", ")}`).to.equal(true);
    const owners = new Set(rows.rows.map((r) => r.claimed_by));
    expect([...owners].sort()).to.deep.equal(team.map((f) => f.id).sort());
    // And the execserver ran each exactly once.
    const status = await exec.status();
    expect(Number(status.waitgroups.find((w) => w.name === "bench")!.completed)).to.equal(total);
  });

  it("5 fylrs on a 40-slot execserver never hold more than 10 exec items each", async function () {
    this.timeout(120_000);
    exec = await spawnExecserver({ instanceId: "exec-40", waitgroups: { forty: { processes: 40 } }, services: { sleep: { waitgroup: "forty", command: ["sleep"] } } });
    const team = await startFylrs(5);
    // Submit only once every fylr sees all five clients: its share is then ceil(40/5) + 2.
    await waitFor("every fylr's admission to be 10", async () => {
      const stats = await Promise.all(team.map((f) => f.client.stats({})));
      return stats.every((s) => s.execAdmission === 10);
    });
    const total = 120;
    // A backlog, all at once: submitted one by one, items would be claimed as they come, and
    // on a loaded machine submits come slower than 40 one-second sleeps drain, so no fylr
    // would ever need its whole share. Held back by start_after, then released together.
    const later = timestampFromDate(new Date(Date.now() + 3_600_000));
    for (let i = 0; i < total; i++) await team[i % 5]!.client.submit({ calls: [{ service: "sleep", args: ["1"] }], startAfter: later });
    await pool.query("UPDATE queue_items SET start_after = now()");
    const most: Held = {};
    for (;;) {
      const held = await heldByFylr(pool);
      for (const [id, n] of Object.entries(held)) most[id] = Math.max(most[id] ?? 0, n);
      if (((await countByState(pool)).succeeded ?? 0) === total) break;
      // A sampling interval: the most each fylr held is what is measured.
      await new Promise((r) => setTimeout(r, 50));
    }
    expect(Object.keys(most).sort()).to.deep.equal(team.map((f) => f.id).sort());
    expect(Object.values(most).every((n) => n <= 10), JSON.stringify(most)).to.equal(true);
    // With a backlog every fylr filled its share at some point.
    expect(Object.values(most).every((n) => n === 10), JSON.stringify(most)).to.equal(true);
  });

  it("after a fylr is killed with SIGKILL, a survivor requeues its claims within the threshold and finishes them", async function () {
    this.timeout(120_000);
    exec = await spawnExecserver({ instanceId: "exec-4", waitgroups: { four: { processes: 4 } }, services: { sleep: { waitgroup: "four", command: ["sleep"] } } });
    const [victim, survivor] = await startFylrs(2);
    const total = 8;
    for (let i = 0; i < total; i++) await victim!.client.submit({ calls: [{ service: "sleep", args: ["3"] }] });
    // Both hold what their share allows (ceil(4 / 2) + 2 = 4 each): every item is claimed.
    const held = await waitFor("every item claimed, some by the victim", async () => {
      const byFylr = await heldByFylr(pool);
      return (byFylr[victim!.id] ?? 0) > 0 && Object.values(byFylr).reduce((a, b) => a + b, 0) === total ? byFylr : undefined;
    });
    const victimItems = (await pool.query<{ id: string }>("SELECT id FROM queue_items WHERE claimed_by = $1", [victim!.id])).rows.map((r) => r.id);
    expect(victimItems).to.have.length(held[victim!.id]!);

    expect(await victim!.stop("SIGKILL")).to.equal(null);
    // staleAfter is 2 s and a survivor sweeps on each heartbeat (200 ms): a bounded wait.
    await waitFor(
      "the survivor to requeue the victim's claims",
      async () => Object.keys(await heldByFylr(pool)).every((id) => id !== victim!.id) && (await countByState(pool)).succeeded !== total,
      2_000 + 3_000,
      50,
    );
    await waitFor("every item to finish", async () => (await countByState(pool)).succeeded === total, 60_000, 100);
    const rows = await pool.query<{ id: string; claimed_by: string; lease: string }>("SELECT id, claimed_by, lease FROM queue_items WHERE id = ANY($1)", [victimItems]);
    expect(rows.rows.every((r) => r.claimed_by === survivor!.id && Number(r.lease) === 2), JSON.stringify(rows.rows)).to.equal(true);
    expect(Number((await survivor!.client.stats({})).orphansRescuedTotal)).to.equal(victimItems.length);
    // The dead owner's late completion is refused by its old lease.
    const late = await new QueueStore(pool).complete({ id: victimItems[0]!, claimedBy: victim!.id, lease: 1 }, [], inlineOutput(Buffer.from("late")));
    expect(late).to.equal(false);
    const { item } = await survivor!.client.get({ id: victimItems[0]! });
    expect(item?.state).to.equal(ItemState.SUCCEEDED);
    expect(item?.claimedBy).to.equal("");
  });
});
