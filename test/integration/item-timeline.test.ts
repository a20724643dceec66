// The item timeline with real processes: an item whose fylr is SIGKILLed mid-job is
// rescued and run by the survivor, and History and `slotbroker show` tell the whole story;
// an item keeps its latest 200 events; Delete takes them along.
import { expect } from "chai";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type pg from "pg";
import { Code } from "@connectrpc/connect";
import { ErrorKind } from "../../gen/slotbroker/v1/broker_pb.js";
import { ItemEventKind, ItemState, type ItemEvent } from "../../gen/slotbroker/v1/queue_pb.js";
import { durationMs } from "@bufbuild/protobuf/wkt";
import { followItem } from "../../src/api/index.js";
import { spawnExecserver, waitFor, type ExecserverProcess } from "../../harness/execserver-process.js";
import { createTestDatabase } from "../support/postgres.js";
import { expectCode, runsOf } from "./cancel-support.js";
import { closeAll, fastFylrConfig, openPool, slotbroker, spawnFylr, type FylrProcess } from "./support.js";

const kindName = (e: ItemEvent): string => ItemEventKind[e.kind];

describe("item timeline", function () {
  this.timeout(120_000);
  let exec: ExecserverProcess | undefined;
  let fylrs: FylrProcess[] = [];
  let pool: pg.Pool | undefined;
  let dir: string;

  beforeEach(() => (dir = mkdtempSync(join(tmpdir(), "slotbroker-timeline-"))));
  afterEach(async () => {
    await closeAll(...fylrs, exec, pool);
    fylrs = [];
    rmSync(dir, { recursive: true, force: true });
  });

  it("shows an item rescued from a SIGKILLed fylr and run by the survivor, in History and `slotbroker show`", async () => {
    const databaseUrl = await createTestDatabase("timeline_kill");
    exec = await spawnExecserver({
      instanceId: "exec-timeline",
      waitgroups: { one: { processes: 1 } },
      services: { slow: { waitgroup: "one", command: ["sh", "-c", 'echo $$ >> "$1"; sleep 1', "slow"], timeout: "1m" } },
    });
    const config = fastFylrConfig(databaseUrl, [exec.grpcAddress]);
    fylrs = [await spawnFylr(config, "t1"), await spawnFylr(config, "t2")];
    pool = openPool(databaseUrl);
    await waitFor("2 fylrs connected", async () => (await exec!.status()).connections.length >= 2);
    const runs = join(dir, "runs");
    const { item } = await fylrs[0]!.client.submit({ calls: [{ service: "slow", args: [runs] }], maxAttempts: 3 });
    const id = item!.id;
    await runsOf(runs);
    const running = await waitFor("the item running", async () => {
      const now = (await fylrs[0]!.client.get({ id })).item!;
      return now.state === ItemState.RUNNING ? now : undefined;
    });
    const holder = fylrs.find((f) => f.id === running.claimedBy)!;
    const survivor = fylrs.find((f) => f !== holder)!;
    await holder.stop("SIGKILL");
    const final = await followItem(survivor.client, id);
    expect(ItemState[final.state]).to.equal("SUCCEEDED");

    const { events, eventsDropped } = await survivor.client.history({ id });
    expect(eventsDropped).to.equal(0);
    expect(events.map((e) => [kindName(e), e.fylr, e.attempt])).to.deep.equal([
      ["SUBMITTED", "", 0],
      ["CLAIMED", holder.id, 1],
      ["RUNNING", holder.id, 1],
      ["REQUEUED", survivor.id, 1],
      ["CLAIMED", survivor.id, 2],
      ["CALL_STARTED", survivor.id, 2],
      ["RUNNING", survivor.id, 2],
      ["CALL_ENDED", survivor.id, 2],
      ["SUCCEEDED", survivor.id, 2],
    ]);
    // By time: the call's events were written when it settled, after the 'running' mark.
    expect(events.map((e) => e.number)).to.deep.equal([1, 2, 3, 4, 5, 7, 6, 8, 9]);
    expect(events[3]!.detail).to.equal(`rescued: fylr ${holder.id} stopped heartbeating`);
    const [started, ended] = [events[5]!, events[7]!];
    expect(started).to.include({ service: "slow", execserver: "exec-timeline" });
    expect(durationMs(started.slotWait!)).to.be.at.least(0).and.below(10_000);
    expect(ended).to.include({ service: "slow", execserver: "exec-timeline", exitCode: 0, errorKind: ErrorKind.UNSPECIFIED });
    expect(durationMs(ended.duration!)).to.be.at.least(900);
    // The rescue came a stale heartbeat (staleAfter 2 s) after the kill: the step shows it.
    const at = events.map((e) => e.at!.seconds * 1000n + BigInt(Math.round(e.at!.nanos / 1e6)));
    expect(Number(at[3]! - at[2]!)).to.be.at.least(1500);

    const shown = await slotbroker(["show", id, "--api", survivor.url]);
    expect(shown.code, shown.stderr).to.equal(0);
    const text = shown.stdout.toString();
    expect(text).to.include(`item ${id}: slow, priority 0`);
    expect(text).to.match(/state succeeded after \d+\.\d+s, attempts 2 of 3/);
    expect(text).to.match(new RegExp(`   2  \\S+ +\\+\\S+  claimed by ${holder.id} \\(attempt 1\\)`));
    expect(text).to.match(new RegExp(`   4  \\S+ +\\+\\d\\.\\d\\ds  requeued by ${survivor.id} \\(attempt 1\\): rescued: fylr ${holder.id} stopped heartbeating`));
    expect(text).to.match(/call slow started on exec-timeline after \d+ms waiting for a slot \(attempt 2\)/);
    // The runtime as the execserver saw it: at least 0.9 s (as History says above); with the
    // job launcher the clock starts when the job's pipes reach the execserver, just after the fork.
    const ran = /call slow ended on exec-timeline: exit 0 after (\d+ms|\d+\.\d\ds)\n/.exec(text);
    expect(ran, text).to.not.equal(null);
    const tookMs = ran![1]!.endsWith("ms") ? Number(ran![1]!.slice(0, -2)) : Number(ran![1]!.slice(0, -1)) * 1000;
    expect(tookMs).to.be.at.least(900).and.below(10_000);
    expect(text).to.match(new RegExp(`   9  .*succeeded by ${survivor.id} \\(attempt 2\\)`));

    // The status page's item view tells the same story; the recent items link to it.
    const page = await fetch(`${survivor.url}/status/items/${id}`);
    expect(page.status).to.equal(200);
    const body = await page.text();
    expect(body).to.include(`<td>requeued by ${survivor.id} (attempt 1): rescued: fylr ${holder.id} stopped heartbeating</td>`);
    expect(body).to.include(`<td>call slow ended on exec-timeline: exit 0 after ${ran![1]}</td>`);
    expect((await fetch(`${survivor.url}/status`)).status).to.equal(200);
    expect((await fetch(`${survivor.url}/status/items/00000000-0000-0000-0000-000000000000`)).status).to.equal(404);
    expect((await fetch(`${survivor.url}/status/items/nope`)).status).to.equal(400);

    // Delete takes the events along.
    await survivor.client.delete({ id });
    await expectCode(survivor.client.history({ id }), Code.NotFound);
    const { rows } = await pool.query<{ n: number }>("SELECT count(*)::int AS n FROM item_events WHERE item_id = $1", [id]);
    expect(rows[0]!.n).to.equal(0);
  });

  it("keeps an item's latest 200 events", async () => {
    const databaseUrl = await createTestDatabase("timeline_cap");
    exec = await spawnExecserver({
      waitgroups: { two: { processes: 2 } },
      services: { noop: { waitgroup: "two", builtin: "noop" as const }, fail: { waitgroup: "two", command: ["false"] } },
    });
    fylrs = [await spawnFylr(fastFylrConfig(databaseUrl, [exec.grpcAddress]), "cap")];
    const { client } = fylrs[0]!;
    // 60 calls that pass, then one that fails: 2 events per call, so two attempts pass 200.
    const calls = [...Array.from({ length: 60 }, () => ({ service: "noop" })), { service: "fail" }];
    const { item } = await client.submit({ calls, maxAttempts: 1 });
    const id = item!.id;
    expect(ItemState[(await followItem(client, id)).state]).to.equal("FAILED");
    await client.retry({ id });
    expect(ItemState[(await followItem(client, id)).state]).to.equal("FAILED");
    const { events, eventsDropped } = await client.history({ id });
    expect(events).to.have.length(200);
    const total = Math.max(...events.map((e) => e.number));
    expect(total).to.be.at.least(250);
    expect(eventsDropped).to.equal(total - 200);
    expect(events.map((e) => e.number).sort((a, b) => a - b)).to.deep.equal(Array.from({ length: 200 }, (_, i) => total - 199 + i));
    expect(kindName(events[199]!)).to.equal("FAILED");
    expect(events.filter((e) => kindName(e) === "RETRIED")).to.have.length(1);
    expect(events[198]).to.include({ service: "fail", exitCode: 1 });
  });
});
