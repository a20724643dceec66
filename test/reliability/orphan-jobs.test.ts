// Finding 3 of the trust review, with real processes: a SIGKILLed execserver must take
// its running jobs with it, so the fylr's retry elsewhere is not a second run that
// overlaps a first one nobody stops any more.
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { expect } from "chai";
import type pg from "pg";
import { ItemState } from "../../gen/slotbroker/v1/queue_pb.js";
import { spawnExecserver, waitFor, type ExecserverProcess } from "../support/execserver-process.js";
import { createTestDatabase } from "../support/postgres.js";
import { closeAll, fastFylrConfig, openPool, spawnFylr, type FylrProcess } from "../integration/support.js";

function lines(path: string): string[] {
  try {
    return readFileSync(path, "utf8").split("\n").filter(Boolean);
  } catch {
    return [];
  }
}

// A zombie (killed, not yet reaped by whoever inherited it) counts as gone.
function alive(pid: number): boolean {
  try {
    return !/^\d+ \(.*\) Z/.test(readFileSync(`/proc/${pid}/stat`, "utf8"));
  } catch {
    return false;
  }
}

describe("reliability: a job never outlives its execserver", () => {
  let databaseUrl: string;
  let pool: pg.Pool;
  let dir: string;
  let execs: ExecserverProcess[] = [];
  let fylr: FylrProcess | undefined;

  before(async () => {
    databaseUrl = await createTestDatabase("orphan_jobs");
  });
  beforeEach(async () => {
    pool = openPool(databaseUrl);
    await pool.query("DROP SCHEMA public CASCADE; CREATE SCHEMA public");
    dir = mkdtempSync(join(tmpdir(), "slotbroker-ledger-"));
  });
  afterEach(async () => {
    await closeAll(fylr, ...execs, pool);
    fylr = undefined;
    execs = [];
    rmSync(dir, { recursive: true, force: true });
  });

  it("finding 3: SIGKILL of an execserver kills its running jobs (and their children) at once; the retry elsewhere runs alone", async function () {
    this.timeout(120_000);
    const started = join(dir, "started");
    const finished = join(dir, "finished");
    // Each run records its pid and the pid of a background child in the same group.
    const script = `sleep 30 & echo "$$ $!" >> ${started}; sleep 3; echo "$$" >> ${finished}; kill $! 2>/dev/null`;
    const services = { ledger: { waitgroup: "w", command: ["sh", "-c", script] } };
    const victim = await spawnExecserver({ instanceId: "exec-victim", waitgroups: { w: { processes: 4 } }, services });
    execs.push(victim);
    fylr = await spawnFylr(fastFylrConfig(databaseUrl, [victim.grpcAddress]), "f-orphans");
    const ids: string[] = [];
    for (let i = 0; i < 4; i++) ids.push((await fylr.client.submit({ calls: [{ service: "ledger", args: [String(i)] }], maxAttempts: 3 })).item!.id);
    await waitFor("4 jobs running on the victim", () => lines(started).length >= 4, 30_000);
    const firstRuns = lines(started).map((l) => l.split(" ").map(Number));
    const killedAt = Date.now();
    await victim.kill("SIGKILL");
    await waitFor(
      "every job of the killed execserver (and its background child) to be gone",
      () => firstRuns.every((pids) => pids.every((pid) => !alive(pid))),
      2_000,
      20,
    );
    const gone = Date.now() - killedAt;
    // A survivor takes the retries; the killed runs never finish.
    const survivor = await spawnExecserver({ instanceId: "exec-survivor", waitgroups: { w: { processes: 4 } }, services });
    execs.push(survivor);
    const next = await spawnFylr(fastFylrConfig(databaseUrl, [survivor.grpcAddress]), "f-survivor");
    const first = fylr;
    fylr = next;
    await closeAll(first);
    await waitFor(
      "every item to succeed on the survivor",
      async () => (await pool.query<{ n: number }>("SELECT count(*)::int AS n FROM queue_items WHERE state = 'succeeded'")).rows[0]!.n === 4,
      60_000,
      200,
    );
    const killedPids = new Set(firstRuns.map((pids) => pids[0]));
    const finishedPids = lines(finished).map(Number);
    expect(finishedPids.filter((pid) => killedPids.has(pid)), `finished runs of the killed execserver (gone after ${gone} ms)`).to.deep.equal([]);
    expect(finishedPids).to.have.length(4);
    for (const id of ids) expect((await next.client.get({ id })).item!.state).to.equal(ItemState.SUCCEEDED);
  });
});
