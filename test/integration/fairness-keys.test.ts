// Fairness keys with real processes: `slotbroker fylr` children sharing one Postgres and a
// real `slotbroker execserver` child. Claims take keys in turn within a priority; a key's
// limit holds across fylrs and across a fylr's death; items without a key queue as before.
import { timestampFromDate } from "@bufbuild/protobuf/wkt";
import { expect } from "chai";
import type pg from "pg";
import { spawnExecserver, waitFor, type ExecserverProcess } from "../../harness/execserver-process.js";
import { createTestDatabase } from "../support/postgres.js";
import { closeAll, fastFylrConfig, openPool, spawnFylr, type FylrProcess } from "./support.js";

type ClaimRow = { id: string; fairness_key: string; claimed_at: Date; claimed_by: string; lease: string; state: string; seq: string };

async function rows(pool: pg.Pool): Promise<ClaimRow[]> {
  return (await pool.query<ClaimRow>("SELECT id, fairness_key, claimed_at, claimed_by, lease, state, seq FROM queue_items ORDER BY seq")).rows;
}

async function heldOf(pool: pg.Pool, key: string): Promise<number> {
  const r = await pool.query<{ n: number }>("SELECT count(*)::int AS n FROM queue_items WHERE fairness_key = $1 AND state IN ('claimed', 'running')", [key]);
  return r.rows[0]!.n;
}

async function succeeded(pool: pg.Pool): Promise<number> {
  return (await pool.query<{ n: number }>("SELECT count(*)::int AS n FROM queue_items WHERE state = 'succeeded'")).rows[0]!.n;
}

/** For each item of `key`: how many items of other keys were claimed strictly before it. */
function othersBefore(all: readonly ClaimRow[], key: string): number[] {
  return all
    .filter((r) => r.fairness_key === key)
    .map((r) => all.filter((o) => o.fairness_key !== key && o.claimed_at.getTime() < r.claimed_at.getTime()).length);
}

describe("fairness keys across fylr processes", function () {
  this.timeout(120_000);
  let databaseUrl: string;
  let pool: pg.Pool;
  let exec: ExecserverProcess | undefined;
  let fylrs: FylrProcess[] = [];

  before(async () => {
    databaseUrl = await createTestDatabase("fairness_proc");
  });
  beforeEach(async () => {
    pool = openPool(databaseUrl);
    await pool.query("DROP SCHEMA public CASCADE; CREATE SCHEMA public");
  });
  afterEach(async () => {
    await closeAll(...fylrs, exec, pool);
    fylrs = [];
    exec = undefined;
  });

  const startExec = (slots: number): Promise<ExecserverProcess> =>
    spawnExecserver({
      instanceId: `exec-${slots}`,
      offerTimeout: "30s",
      waitgroups: { w: { processes: slots } },
      services: { noop: { waitgroup: "w", builtin: "noop" }, sleep: { waitgroup: "w", command: ["sleep"] } },
    });

  const startFylrs = async (n: number): Promise<FylrProcess[]> => {
    const extra = { execserver: { addresses: [exec!.grpcAddress], pingTimeout: "30s", keepaliveTimeout: "60s" } };
    const started: FylrProcess[] = [];
    for (let i = 0; i < n; i++) started.push(await spawnFylr(fastFylrConfig(databaseUrl, [exec!.grpcAddress], extra), `k${fylrs.length + i}`));
    fylrs.push(...started);
    await waitFor(`${fylrs.length} fylrs connected`, async () => (await exec!.status()).connections.length >= fylrs.length);
    return started;
  };

  /** Submits held back by start_after, then releases them together: a backlog that exists before any claim. */
  const later = () => timestampFromDate(new Date(Date.now() + 3_600_000));
  const release = () => pool.query("UPDATE queue_items SET start_after = now() WHERE state = 'queued'");

  it("two fylrs claiming at once take keys in turn, each item once", async () => {
    exec = await startExec(2);
    const [f1, f2] = await startFylrs(2);
    for (let i = 0; i < 40; i++) await f1!.client.submit({ calls: [{ service: "sleep", args: ["0.05"] }], fairnessKey: "A", startAfter: later() });
    for (let i = 0; i < 5; i++) await f2!.client.submit({ calls: [{ service: "sleep", args: ["0.05"] }], fairnessKey: "B", startAfter: later() });
    await release();
    await waitFor("every item to finish", async () => (await succeeded(pool)) === 45, 90_000, 200);
    const all = await rows(pool);
    expect(all.filter((r) => Number(r.lease) !== 1), "claimed more than once").to.deep.equal([]);
    // Oldest-first would claim all 40 of A before any of B. In turn, B's i-th item follows
    // about i of A's; a batch claimed by the other fylr at the same moment adds a few.
    const before = othersBefore(all, "B");
    expect(Math.max(...before), JSON.stringify(before)).to.be.at.most(10);
    // Within a key, oldest first: each fylr claimed A's items in submission order (ties: one
    // batch). Across fylrs claimed_at is when the claiming transaction began, so a claimer
    // that began first but reached the rows second (SKIP LOCKED) shows an older timestamp
    // on a newer item; that is two claims racing, not an order broken.
    for (const fylr of [f1!, f2!]) {
      const a = all.filter((r) => r.fairness_key === "A" && r.claimed_by === fylr.id);
      const inversions = a.filter((r, i) => i > 0 && r.claimed_at.getTime() < a[i - 1]!.claimed_at.getTime() - 50);
      expect(inversions, `A claimed out of order by ${fylr.id}`).to.deep.equal([]);
    }
  });

  it("holds a key's limit across two fylrs while other keys go on", async () => {
    exec = await startExec(8);
    const [f1, f2] = await startFylrs(2);
    for (let i = 0; i < 8; i++) await f1!.client.submit({ calls: [{ service: "sleep", args: ["0.4"] }], fairnessKey: "L", fairnessLimit: 2, startAfter: later() });
    for (let i = 0; i < 8; i++) await f2!.client.submit({ calls: [{ service: "sleep", args: ["0.4"] }], fairnessKey: "F", startAfter: later() });
    await release();
    let mostL = 0;
    let mostF = 0;
    while ((await succeeded(pool)) < 16) {
      mostL = Math.max(mostL, await heldOf(pool, "L"));
      mostF = Math.max(mostF, await heldOf(pool, "F"));
      // A sampling interval: the most each key held is what is measured.
      await new Promise((r) => setTimeout(r, 20));
    }
    expect(mostL, "L held at once").to.equal(2);
    expect(mostF, "F held at once (not blocked by L)").to.be.greaterThan(2);
    const owners = (await pool.query<{ claimed_by: string }>("SELECT DISTINCT claimed_by FROM queue_items WHERE fairness_key = 'L'")).rows;
    expect(owners.length, "both fylrs ran L's items").to.equal(2);
  });

  it("keeps a key's limit right when the fylr holding its items dies", async () => {
    exec = await startExec(4);
    const [victim] = await startFylrs(1);
    // The first two (oldest first: the victim's) long enough that the victim still holds
    // them when it dies, after the survivor started; the other two wait for the limit.
    for (const seconds of ["6", "6", "1", "1"]) await victim!.client.submit({ calls: [{ service: "sleep", args: [seconds] }], fairnessKey: "L", fairnessLimit: 2, maxAttempts: 3 });
    await waitFor("the victim holding L's limit", async () => (await heldOf(pool, "L")) === 2);
    const [survivor] = await startFylrs(1);
    expect(await victim!.stop("SIGKILL")).to.equal(null);
    let most = 0;
    while ((await succeeded(pool)) < 4) {
      most = Math.max(most, await heldOf(pool, "L"));
      await new Promise((r) => setTimeout(r, 20));
    }
    expect(most, "L held at once, before and after the rescue").to.be.at.most(2);
    const all = await rows(pool);
    expect(all.every((r) => r.state === "succeeded")).to.equal(true);
    const bySurvivor = (await pool.query<{ n: number }>("SELECT count(*)::int AS n FROM queue_items WHERE claimed_by = $1", [survivor!.id])).rows[0]!.n;
    expect(bySurvivor).to.equal(4);
  });

  it("queues an old client's items without a key first in, first out, next to a keyed client's", async () => {
    exec = await startExec(1);
    const [fylr] = await startFylrs(1);
    // An old client's JSON: no fairness fields at all.
    const body = () => JSON.stringify({ calls: [{ service: "sleep", args: ["0.05"] }], startAfter: new Date(Date.now() + 3_600_000).toISOString() });
    for (let i = 0; i < 6; i++) {
      const res = await fetch(`${fylr!.url}/slotbroker.v1.QueueService/Submit`, { method: "POST", headers: { "content-type": "application/json" }, body: body() });
      expect(res.status).to.equal(200);
    }
    for (let i = 0; i < 6; i++) await fylr!.client.submit({ calls: [{ service: "sleep", args: ["0.05"] }], fairnessKey: "K", startAfter: later() });
    await release();
    await waitFor("every item to finish", async () => (await succeeded(pool)) === 12, 60_000, 100);
    const all = await rows(pool);
    const old = all.filter((r) => r.fairness_key === "");
    expect(old).to.have.length(6);
    // First in, first out among the old client's items (one fylr: claims are sequential).
    for (let i = 1; i < old.length; i++) expect(old[i]!.claimed_at.getTime()).to.be.at.least(old[i - 1]!.claimed_at.getTime());
    // And the two keys took turns: the i-th item of either key followed about i of the
    // other's (oldest first overall would put all six of K after all six without a key).
    for (const key of ["", "K"]) {
      const before = othersBefore(all, key);
      expect(before.every((n, i) => n <= i + 2), `${JSON.stringify(key)}: ${JSON.stringify(before)}`).to.equal(true);
    }
  });
});
