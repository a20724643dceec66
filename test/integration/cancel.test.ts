// Cancel at every stage of an item, with real processes: `slotbroker fylr` children sharing
// one Postgres and a `slotbroker execserver` child that runs real process groups. A cancel
// is sent to the fylr that does NOT hold the item wherever that matters, so it has to
// travel through the database to the holder. No job process may survive a cancel.
import { expect } from "chai";
import { existsSync, mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Code, ConnectError } from "@connectrpc/connect";
import { timestampFromDate } from "@bufbuild/protobuf/wkt";
import type pg from "pg";
import { ErrorKind } from "../../gen/slotbroker/v1/broker_pb.js";
import { ItemState, type Item } from "../../gen/slotbroker/v1/queue_pb.js";
import { followItem, type QueueClient } from "../../src/api/index.js";
import { spawnExecserver, waitFor, type ExecserverProcess } from "../../harness/execserver-process.js";
import { createTestDatabase } from "../support/postgres.js";
import { groupGone } from "../support/process-group.js";
import { cancelExecConfig, expectCode, runsOf } from "./cancel-support.js";
import { closeAll, fastFylrConfig, openPool, slotbroker, spawnFylr, type FylrProcess } from "./support.js";

describe("cancel, retry, delete across fylr processes", function () {
  this.timeout(120_000);
  let databaseUrl: string;
  let pool: pg.Pool;
  let exec: ExecserverProcess;
  let fylrs: FylrProcess[];
  let dir: string;

  before(async () => {
    databaseUrl = await createTestDatabase("cancel_proc");
    exec = await spawnExecserver(cancelExecConfig);
    const config = fastFylrConfig(databaseUrl, [exec.grpcAddress], { dispatcher: { cancelBound: "5s" } });
    fylrs = [await spawnFylr(config, "fa")];
    fylrs.push(await spawnFylr(config, "fb"));
    pool = openPool(databaseUrl);
    await waitFor("2 fylrs connected", async () => (await exec.status()).connections.length >= 2);
  });
  after(async () => closeAll(...fylrs, exec, pool));
  beforeEach(() => (dir = mkdtempSync(join(tmpdir(), "slotbroker-cancel-"))));
  afterEach(async () => {
    // Nothing may be left running for the next test.
    await waitFor("the execserver to be idle", async () => (await exec.status()).waitgroups.every((w) => w.running === 0 && Number(w.waiting) === 0));
    rmSync(dir, { recursive: true, force: true });
  });

  const holderAndOther = (item: Item): { holder: QueueClient; other: QueueClient } => {
    const holder = fylrs.find((f) => f.id === item.claimedBy);
    expect(holder, `item held by ${item.claimedBy}`).to.not.equal(undefined);
    return { holder: holder!.client, other: fylrs.find((f) => f !== holder)!.client };
  };

  const stateOf = async (id: string): Promise<Item> => (await fylrs[0]!.client.get({ id })).item!;

  it("queued: cancelled at once; then retried with fresh attempts, run, and deleted", async () => {
    const later = timestampFromDate(new Date(Date.now() + 3_600_000));
    const { item } = await fylrs[0]!.client.submit({ calls: [{ service: "noop" }], startAfter: later });
    const cancelled = (await fylrs[1]!.client.cancel({ id: item!.id })).item!;
    expect(ItemState[cancelled.state]).to.equal("CANCELLED");
    expect(cancelled.finishedAt).to.not.equal(undefined);
    // Idempotent.
    expect(ItemState[(await fylrs[0]!.client.cancel({ id: item!.id })).item!.state]).to.equal("CANCELLED");
    // Watch ends on CANCELLED.
    expect(ItemState[(await followItem(fylrs[0]!.client, item!.id)).state]).to.equal("CANCELLED");
    // Delete refuses an unfinished item; Retry refuses a queued one; both name the state.
    const retried = (await fylrs[0]!.client.retry({ id: item!.id })).item!;
    expect(ItemState[retried.state]).to.equal("QUEUED");
    expect(retried.attempts).to.equal(0);
    const done = await followItem(fylrs[1]!.client, item!.id);
    expect(ItemState[done.state]).to.equal("SUCCEEDED");
    await expectCode(fylrs[0]!.client.cancel({ id: item!.id }), Code.FailedPrecondition, /is succeeded/);
    await expectCode(fylrs[0]!.client.retry({ id: item!.id }), Code.FailedPrecondition, /is succeeded/);
    await fylrs[1]!.client.delete({ id: item!.id });
    await expectCode(fylrs[0]!.client.get({ id: item!.id }), Code.NotFound);
    await expectCode(fylrs[0]!.client.cancel({ id: item!.id }), Code.NotFound);
  });

  it("running: cancelled through the fylr that does not hold it; the process group is gone; the receipt says CANCEL_REQUESTED", async () => {
    const runs = join(dir, "runs");
    const { item } = await fylrs[0]!.client.submit({ calls: [{ service: "stubborn", args: [runs] }], maxAttempts: 3 });
    const [pgid] = await runsOf(runs);
    const running = await waitFor("the item running", async () => {
      const now = await stateOf(item!.id);
      return now.state === ItemState.RUNNING ? now : undefined;
    });
    const { holder, other } = holderAndOther(running);
    // Watch on the holder reports the request, then the end.
    const updates: Item[] = [];
    const watched = followItem(holder, item!.id, { onUpdate: (u) => updates.push(u.item!) });
    await waitFor("the watch's first update", () => updates.length > 0 || undefined);
    const answer = (await other.cancel({ id: item!.id })).item!;
    expect(ItemState[answer.state]).to.equal("RUNNING");
    expect(answer.cancelRequestedAt).to.not.equal(undefined);
    expect(ItemState[(await watched).state]).to.equal("CANCELLED");
    // SIGTERM is ignored for the 300 ms grace, so the request shows before the end.
    expect(updates.some((u) => u.state === ItemState.RUNNING && u.cancelRequestedAt !== undefined), "an update with the request").to.equal(true);
    const final = await followItem(other, item!.id);
    expect(ItemState[final.state]).to.equal("CANCELLED");
    expect(final.results).to.have.length(1);
    expect(ErrorKind[final.results[0]!.receipt!.error]).to.equal("CANCEL_REQUESTED");
    expect(await groupGone(pgid!)).to.equal(true);
    // Never run again: one run recorded, one attempt spent.
    expect(readFileSync(runs, "utf8").trim().split("\n")).to.have.length(1);
    expect(final.attempts).to.equal(1);
  });

  it("claimed, its want parked at the execserver: cancelled at once, the want withdrawn, never run", async () => {
    const blockerRuns = join(dir, "blocker");
    const runs = join(dir, "runs");
    const blocker = (await fylrs[0]!.client.submit({ calls: [{ service: "stubborn", args: [blockerRuns] }] })).item!;
    const [blockerGroup] = await runsOf(blockerRuns);
    const { item } = await fylrs[1]!.client.submit({ calls: [{ service: "stubborn", args: [runs] }] });
    await waitFor("the second want parked", async () => Number((await exec.status()).waitgroups.find((w) => w.name === "one")!.waiting) === 1);
    const claimed = await stateOf(item!.id);
    expect(ItemState[claimed.state]).to.equal("CLAIMED");
    const { other } = holderAndOther(claimed);
    const answer = (await other.cancel({ id: item!.id })).item!;
    expect(ItemState[answer.state]).to.equal("CANCELLED");
    await waitFor("the want withdrawn", async () => Number((await exec.status()).waitgroups.find((w) => w.name === "one")!.waiting) === 0);
    await fylrs[0]!.client.cancel({ id: blocker.id });
    expect(ItemState[(await followItem(fylrs[0]!.client, blocker.id)).state]).to.equal("CANCELLED");
    expect(await groupGone(blockerGroup!)).to.equal(true);
    expect(existsSync(runs)).to.equal(false);
  });

  it("a chain cancelled during its first call: the later call never starts", async () => {
    const runs = join(dir, "runs");
    const marker = join(dir, "marker");
    const { item } = await fylrs[0]!.client.submit({
      calls: [
        { service: "stubborn", args: [runs] },
        { service: "marker", args: [marker], stdin: { case: "stdinFromPrevious", value: true } },
      ],
    });
    const [pgid] = await runsOf(runs);
    await fylrs[1]!.client.cancel({ id: item!.id });
    const final = await followItem(fylrs[1]!.client, item!.id);
    expect(ItemState[final.state]).to.equal("CANCELLED");
    expect(await groupGone(pgid!)).to.equal(true);
    expect(existsSync(marker)).to.equal(false);
  });

  it("a chain cancelled between its two calls (the second one's want parked): the second never starts", async () => {
    const blockerRuns = join(dir, "blocker");
    const first = join(dir, "first");
    const second = join(dir, "second");
    const blocker = (await fylrs[0]!.client.submit({ calls: [{ service: "stubborn", args: [blockerRuns] }] })).item!;
    await runsOf(blockerRuns);
    const { item } = await fylrs[0]!.client.submit({
      calls: [
        { service: "quick", args: [first, "0"] },
        { service: "stubborn", args: [second] },
      ],
    });
    await runsOf(first);
    await waitFor("the second call's want parked", async () => Number((await exec.status()).waitgroups.find((w) => w.name === "one")!.waiting) === 1);
    // Written running once the chain has run dispatcher.runningMarkDelay (its first call may end sooner).
    const between = await waitFor("the chain written running", async () => {
      const now = await stateOf(item!.id);
      return now.state === ItemState.RUNNING ? now : undefined;
    });
    const { other } = holderAndOther(between);
    await other.cancel({ id: item!.id });
    const final = await followItem(other, item!.id);
    expect(ItemState[final.state]).to.equal("CANCELLED");
    expect(final.results.map((r) => r.service)).to.deep.equal(["quick"]);
    await fylrs[0]!.client.cancel({ id: blocker.id });
    await followItem(fylrs[0]!.client, blocker.id);
    expect(existsSync(second)).to.equal(false);
  });

  it("cancel vs DONE at the same moment: exactly one final state, the receipt kept", async () => {
    const outcomes: string[] = [];
    for (let i = 0; i < 12; i++) {
      const runs = join(dir, `race-${i}`);
      const { item } = await fylrs[i % 2]!.client.submit({ calls: [{ service: "quick", args: [runs, "0.2"] }] });
      const [pgid] = await runsOf(runs);
      // Aim the cancel at the job's natural end, a little before or after it.
      await new Promise((r) => setTimeout(r, 150 + (i % 6) * 15));
      let answered: string;
      try {
        answered = ItemState[(await fylrs[(i + 1) % 2]!.client.cancel({ id: item!.id })).item!.state];
      } catch (err) {
        expect(ConnectError.from(err).rawMessage).to.match(/is succeeded/);
        answered = "too late";
      }
      let final = await followItem(fylrs[0]!.client, item!.id);
      const state = ItemState[final.state];
      expect(["SUCCEEDED", "CANCELLED"]).to.include(state);
      if (answered === "too late") expect(state).to.equal("SUCCEEDED");
      // The receipt of the one run is kept either way. A cancel that came while the item was
      // still claimed (its job younger than dispatcher.runningMarkDelay, a busy machine's
      // timers late) ended it at once; the receipt joins it when the stopped job's DONE came.
      if (state === "CANCELLED" && final.results.length === 0) {
        final = await waitFor("the stopped job's receipt", async () => {
          const now = await stateOf(item!.id);
          return now.results.length > 0 ? now : undefined;
        });
      }
      expect(final.results, `${state} after "${answered}"`).to.have.length(1);
      expect(final.attempts).to.equal(1);
      expect(await groupGone(pgid!)).to.equal(true);
      // Stays final: nothing flips it afterwards.
      await new Promise((r) => setTimeout(r, 50));
      expect(ItemState[(await stateOf(item!.id)).state]).to.equal(state);
      outcomes.push(state);
    }
    const rows = await pool.query<{ n: number }>("SELECT count(*)::int AS n FROM queue_items WHERE state IN ('queued', 'claimed', 'running')");
    expect(rows.rows[0]!.n).to.equal(0);
    console.log(`      cancel vs DONE outcomes: ${outcomes.join(" ")}`);
  });

  it("cancel vs claim by another fylr: each item ends in one state and nothing runs on after it", async () => {
    const ids: string[] = [];
    const at = new Date(Date.now() + 400);
    for (let i = 0; i < 20; i++) {
      const { item } = await fylrs[i % 2]!.client.submit({ calls: [{ service: "quick", args: [join(dir, `claim-${i}`), "30"] }], startAfter: timestampFromDate(at) });
      ids.push(item!.id);
    }
    // Cancel them as they become claimable, racing both fylrs' claims.
    await new Promise((r) => setTimeout(r, Math.max(0, at.getTime() - Date.now())));
    const answers = await Promise.all(ids.map((id, i) => fylrs[(i + 1) % 2]!.client.cancel({ id })));
    const seen = answers.map((a) => ItemState[a.item!.state]);
    expect(seen.every((s) => s === "CANCELLED" || s === "RUNNING")).to.equal(true);
    const finals = await Promise.all(ids.map((id) => followItem(fylrs[0]!.client, id)));
    expect(finals.map((f) => ItemState[f.state])).to.deep.equal(ids.map(() => "CANCELLED"));
    // Whatever started was stopped: every recorded run's group is gone.
    for (let i = 0; i < ids.length; i++) {
      const file = join(dir, `claim-${i}`);
      if (!existsSync(file)) continue;
      for (const pgid of readFileSync(file, "utf8").trim().split("\n").map(Number)) expect(await groupGone(pgid)).to.equal(true);
    }
    const leases = await pool.query<{ lease: string }>("SELECT lease FROM queue_items WHERE id = ANY($1::uuid[])", [ids]);
    expect(leases.rows.every((r) => Number(r.lease) <= 1)).to.equal(true);
    console.log(`      cancel answers: ${seen.filter((s) => s === "CANCELLED").length} at once, ${seen.filter((s) => s === "RUNNING").length} while running`);
  });

  it("the CLI: slotbroker cancel, list, retry and delete", async () => {
    const api = ["--api", fylrs[0]!.url];
    const later = timestampFromDate(new Date(Date.now() + 3_600_000));
    const { item } = await fylrs[1]!.client.submit({ calls: [{ service: "noop" }], startAfter: later, priority: 7 });
    const id = item!.id;
    const cancel = await slotbroker(["cancel", id, ...api]);
    expect(cancel.code, cancel.stderr).to.equal(0);
    expect(cancel.stdout.toString()).to.match(new RegExp(`^${id} cancelled at `));
    const list = await slotbroker(["list", "--state", "cancelled", "--service", "noop", "--min-priority", "7", ...api]);
    expect(list.code, list.stderr).to.equal(0);
    const lines = list.stdout.toString().trim().split("\n");
    expect(lines[0]).to.match(/^ID\s+STATE\s+PRIO\s+KEY\s+SERVICE\s+ATTEMPTS\s+CREATED$/);
    expect(lines.slice(1).map((l) => l.split(/\s+/).slice(0, 5))).to.deep.equal([[id, "cancelled", "7", "-", "noop"]]);
    const none = await slotbroker(["list", "--state", "failed", ...api]);
    expect(none.code, none.stderr).to.equal(0);
    expect(none.stdout.toString()).to.equal("");
    expect(none.stderr).to.equal("slotbroker list: no items match these filters\n");
    const refused = await slotbroker(["delete", "not-a-uuid", ...api]);
    expect(refused.code).to.equal(1);
    expect(refused.stderr).to.match(/not a UUID/);
    const retry = await slotbroker(["retry", id, ...api]);
    expect(retry.code, retry.stderr).to.equal(0);
    expect(retry.stdout.toString()).to.match(new RegExp(`^${id} queued`));
    expect(ItemState[(await followItem(fylrs[0]!.client, id)).state]).to.equal("SUCCEEDED");
    const again = await slotbroker(["cancel", id, ...api]);
    expect(again.code).to.equal(1);
    expect(again.stderr).to.match(/is succeeded/);
    const del = await slotbroker(["delete", id, ...api]);
    expect(del.code, del.stderr).to.equal(0);
    expect(del.stdout.toString()).to.equal(`${id} deleted\n`);
  });
});
