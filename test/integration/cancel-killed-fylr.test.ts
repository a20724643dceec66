// Cancel of an item whose fylr was SIGKILLed mid-job: the survivors' stale-claim rescue
// must end it CANCELLED, never put it back in the queue, and nothing runs it again.
import { expect } from "chai";
import { existsSync, mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type pg from "pg";
import { ItemState } from "../../gen/slotbroker/v1/queue_pb.js";
import { followItem } from "../../src/api/index.js";
import { spawnExecserver, waitFor, type ExecserverProcess } from "../../harness/execserver-process.js";
import { createTestDatabase } from "../support/postgres.js";
import { groupGone } from "../support/process-group.js";
import { cancelExecConfig, runsOf } from "./cancel-support.js";
import { closeAll, fastFylrConfig, openPool, spawnFylr, type FylrProcess } from "./support.js";

describe("cancel of an item whose fylr was SIGKILLed", function () {
  this.timeout(120_000);
  let exec: ExecserverProcess | undefined;
  let fylrs: FylrProcess[] = [];
  let pool: pg.Pool | undefined;
  let dir: string;

  beforeEach(() => (dir = mkdtempSync(join(tmpdir(), "slotbroker-cancel-kill-"))));
  afterEach(async () => {
    await closeAll(...fylrs, exec, pool);
    fylrs = [];
    rmSync(dir, { recursive: true, force: true });
  });

  it("is cancelled by the survivors' rescue, not requeued; the job's group is gone and it never runs again", async () => {
    const databaseUrl = await createTestDatabase("cancel_kill");
    exec = await spawnExecserver({ ...cancelExecConfig, instanceId: "exec-cancel-kill" });
    // A long cancel bound: the stale-claim rescue (staleAfter 2 s) must be what ends it.
    const config = fastFylrConfig(databaseUrl, [exec.grpcAddress], { dispatcher: { cancelBound: "1m" } });
    fylrs = [await spawnFylr(config, "k1"), await spawnFylr(config, "k2")];
    pool = openPool(databaseUrl);
    await waitFor("2 fylrs connected", async () => (await exec!.status()).connections.length >= 2);
    const runs = join(dir, "runs");
    const { item } = await fylrs[0]!.client.submit({ calls: [{ service: "stubborn", args: [runs] }], maxAttempts: 5 });
    const [pgid] = await runsOf(runs);
    const running = await waitFor("the item running", async () => {
      const now = (await fylrs[0]!.client.get({ id: item!.id })).item!;
      return now.state === ItemState.RUNNING ? now : undefined;
    });
    const holder = fylrs.find((f) => f.id === running.claimedBy)!;
    const survivor = fylrs.find((f) => f !== holder)!;
    await holder.stop("SIGKILL");
    const answer = (await survivor.client.cancel({ id: item!.id })).item!;
    expect(ItemState[answer.state]).to.equal("RUNNING");
    const final = await followItem(survivor.client, item!.id);
    expect(ItemState[final.state]).to.equal("CANCELLED");
    expect(final.error).to.match(/stopped heartbeating/);
    // The execserver stopped the job when the holder's stream dropped.
    expect(await groupGone(pgid!)).to.equal(true);
    // Never claimed again, never run again.
    const row = (await pool.query<{ lease: string; state: string }>("SELECT lease, state FROM queue_items WHERE id = $1", [item!.id])).rows[0]!;
    expect(Number(row.lease)).to.equal(1);
    await new Promise((r) => setTimeout(r, 500));
    expect(existsSync(runs) && readFileSync(runs, "utf8").trim().split("\n")).to.have.length(1);
    expect(ItemState[(await survivor.client.get({ id: item!.id })).item!.state]).to.equal("CANCELLED");
  });
});
