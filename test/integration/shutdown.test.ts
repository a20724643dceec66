// Stopping a `slotbroker fylr` process: SIGTERM lets running items finish and leaves; a
// second SIGTERM gives what still runs back to the queue at once.
import { expect } from "chai";
import type pg from "pg";
import { ItemState } from "../../gen/slotbroker/v1/queue_pb.js";
import { spawnExecserver, waitFor, type ExecserverProcess } from "../../harness/execserver-process.js";
import { inState, watchUntil } from "../support/watch-item.js";
import { createTestDatabase } from "../support/postgres.js";
import { closeAll, fastFylrConfig, openPool, spawnFylr, type FylrProcess } from "./support.js";

describe("stopping a fylr process", () => {
  let databaseUrl: string;
  let pool: pg.Pool;
  let exec: ExecserverProcess;
  let fylr: FylrProcess | undefined;

  before(async () => {
    databaseUrl = await createTestDatabase("shutdown");
  });
  beforeEach(async () => {
    pool = openPool(databaseUrl);
    exec = await spawnExecserver({ instanceId: "exec-stop", waitgroups: { two: { processes: 2 } }, services: { sleep: { waitgroup: "two", command: ["sleep"] } } });
  });
  afterEach(async () => {
    await closeAll(fylr, exec, pool);
    fylr = undefined;
  });

  const state = async (id: string): Promise<{ state: string; attempts: number; claimed_by: string | null }> =>
    (await pool.query<{ state: string; attempts: number; claimed_by: string | null }>("SELECT state, attempts, claimed_by FROM queue_items WHERE id = $1", [id])).rows[0]!;

  it("lets a running item finish on SIGTERM, then exits 0 and leaves the fylrs table", async function () {
    this.timeout(60_000);
    fylr = await spawnFylr(fastFylrConfig(databaseUrl, [exec.grpcAddress], { dispatcher: { stopGrace: "20s" } }));
    const id = (await fylr.client.submit({ calls: [{ service: "sleep", args: ["1.5"] }] })).item!.id;
    await watchUntil(fylr.client, id, "the item to run", inState(ItemState.RUNNING));
    const code = await fylr.stop("SIGTERM");
    expect(code, fylr.stderr()).to.equal(0);
    expect(await state(id)).to.deep.include({ state: "succeeded", attempts: 1 });
    const rows = await pool.query("SELECT id FROM fylrs");
    expect(rows.rowCount).to.equal(0);
  });

  it("gives running items back at once on a second SIGTERM", async function () {
    this.timeout(60_000);
    fylr = await spawnFylr(fastFylrConfig(databaseUrl, [exec.grpcAddress], { dispatcher: { stopGrace: "60s" } }));
    const id = (await fylr.client.submit({ calls: [{ service: "sleep", args: ["30"] }] })).item!.id;
    await watchUntil(fylr.client, id, "the item to run", inState(ItemState.RUNNING));
    fylr.child.kill("SIGTERM");
    // Inside the grace period the item keeps running (and nothing new is claimed): the
    // fylr says it is stopping on /healthz while it waits for the item. (Asked over HTTP:
    // the child process tells it only when asked.)
    await waitFor("the fylr to report stopping", async () => {
      const health = await fetch(`${fylr!.url}/healthz`);
      return health.status === 503 && (await health.text()).includes("stopping");
    });
    expect(fylr.child.exitCode).to.equal(null);
    expect((await state(id)).state).to.equal("running");
    const code = await fylr.stop("SIGTERM");
    expect(code, fylr.stderr()).to.equal(0);
    expect(await state(id)).to.deep.include({ state: "queued", attempts: 0, claimed_by: null });
  });
});
