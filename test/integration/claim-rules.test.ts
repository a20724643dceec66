// Claim rules, end to end with a `slotbroker fylr` process and a real execserver process:
// priority order and start_after, nothing exec-bound without an execserver, and "no slot
// within connectTimeout" moving start_after a minute out.
import { expect } from "chai";
import type pg from "pg";
import { ItemState } from "../../gen/slotbroker/v1/queue_pb.js";
import { freePort } from "../../src/shared/free-port.js";
import { timestampDate, timestampFromDate } from "@bufbuild/protobuf/wkt";
import { spawnExecserver, waitFor, type ExecserverProcess } from "../../harness/execserver-process.js";
import { inState, watchUntil } from "../support/watch-item.js";
import { createTestDatabase } from "../support/postgres.js";
import { closeAll, fastFylrConfig, openPool, spawnFylr, type FylrProcess } from "./support.js";
import type { FylrPageData } from "../../src/status-pages/index.js";

interface Row {
  id: string;
  state: string;
  priority: number;
  attempts: number;
  claimed_by: string | null;
  start_after: Date;
  claimed_at: Date | null;
  finished_at: Date | null;
  created_at: Date;
}

describe("a fylr process's claim rules", () => {
  let databaseUrl: string;
  let pool: pg.Pool;
  let exec: ExecserverProcess | undefined;
  let fylr: FylrProcess | undefined;

  before(async () => {
    databaseUrl = await createTestDatabase("claim_rules");
  });
  beforeEach(async () => {
    pool = openPool(databaseUrl);
    // The whole schema: migrations create functions and triggers too, not only tables.
    await pool.query("DROP SCHEMA public CASCADE; CREATE SCHEMA public");
  });
  afterEach(async () => {
    await closeAll(fylr, exec, pool);
    fylr = undefined;
    exec = undefined;
  });

  const rows = async (): Promise<Row[]> => (await pool.query<Row>("SELECT * FROM queue_items ORDER BY created_at")).rows;
  const oneSlot = { waitgroups: { one: { processes: 1 } }, services: { sleep: { waitgroup: "one", command: ["sleep"] }, cat: { waitgroup: "one", command: ["cat"] } } };

  it("runs items in priority order and none before its start_after", async function () {
    this.timeout(60_000);
    exec = await spawnExecserver({ instanceId: "exec-1", ...oneSlot });
    fylr = await spawnFylr(fastFylrConfig(databaseUrl, [exec.grpcAddress]));
    await waitFor("the fylr to connect", async () => (await fylr!.client.stats({})).execAdmission > 0);
    // All become eligible at the same moment, so only priority decides the order. On one
    // slot they run one after the other: the finish order is the start order.
    const at = timestampFromDate(new Date(Date.now() + 1500));
    const priorities = [3, -1, 7, 0, 5, 1, 7];
    const ids: string[] = [];
    for (const priority of priorities) ids.push((await fylr.client.submit({ calls: [{ service: "sleep", args: ["0.1"] }], priority, startAfter: at })).item!.id);
    const later = new Date(Date.now() + 3500);
    const urgentLater = (await fylr.client.submit({ calls: [{ service: "cat" }], priority: 100, startAfter: timestampFromDate(later) })).item!.id;
    for (const id of [...ids, urgentLater]) await watchUntil(fylr.client, id, `item ${id} to succeed`, inState(ItemState.SUCCEEDED));
    const done = await rows();
    const timed = done.filter((r) => r.id !== urgentLater).sort((a, b) => a.finished_at!.getTime() - b.finished_at!.getTime());
    expect(timed.map((r) => r.priority)).to.deep.equal([...priorities].sort((a, b) => b - a));
    // Same priority: the earlier submitted one first.
    const sevens = timed.filter((r) => r.priority === 7);
    expect(sevens[0]!.created_at.getTime()).to.be.at.most(sevens[1]!.created_at.getTime());
    const urgent = done.find((r) => r.id === urgentLater)!;
    expect(urgent.claimed_at!.getTime(), "claimed before its start_after").to.be.at.least(urgent.start_after.getTime());
    for (const r of timed) expect(r.claimed_at!.getTime()).to.be.at.least(r.start_after.getTime());
  });

  it("claims nothing exec-bound while no execserver is connected, and runs it once one is", async function () {
    this.timeout(60_000);
    // The client is aimed at this port before its server exists, so the server cannot move to
    // another; freePort picks outside the kernel's ephemeral range, where nothing takes it meanwhile.
    const address = `127.0.0.1:${await freePort()}`;
    fylr = await spawnFylr(fastFylrConfig(databaseUrl, [address]));
    const execItem = (await fylr.client.submit({ calls: [{ service: "cat", stdin: { case: "stdinData", value: Buffer.from("late") } }] })).item!.id;
    const localItem = (await fylr.client.submit({ local: { name: "count", input: Buffer.from("a b\n") } })).item!.id;
    // The local item proves the loop is claiming; let it run five more passes after that
    // (the fylr's /status/live.json counts them).
    await watchUntil(fylr.client, localItem, "the local item to finish", inState(ItemState.SUCCEEDED));
    const stats = await fylr.client.stats({});
    const passes = async (): Promise<number> => ((await (await fetch(`${fylr!.url}/status/live.json`)).json()) as FylrPageData).dispatcher.counters.passes ?? 0;
    const after = (await passes()) + 5;
    // The child process tells its pass count only when asked.
    await waitFor("five more loop passes", async () => (await passes()) >= after);
    const [row] = (await rows()).filter((r) => r.id === execItem);
    expect(row).to.deep.include({ state: "queued", attempts: 0, claimed_by: null });
    expect(stats.execAdmission).to.equal(0);
    expect(stats.shares).to.deep.equal([]);

    exec = await spawnExecserver({ instanceId: "exec-late", listen: address, ...oneSlot });
    const item = (await watchUntil(fylr.client, execItem, "the exec item to run", inState(ItemState.SUCCEEDED))).item!;
    expect(Buffer.from(item.output).toString()).to.equal("late");
    expect(item.attempts).to.equal(1);
  });

  it("gives an item that got no slot within connectTimeout back, a minute out, with its attempt", async function () {
    this.timeout(60_000);
    exec = await spawnExecserver({ instanceId: "exec-busy", ...oneSlot });
    fylr = await spawnFylr(fastFylrConfig(databaseUrl, [exec.grpcAddress], { execserver: { addresses: [exec.grpcAddress], connectTimeout: "500ms" } }));
    const blocker = (await fylr.client.submit({ calls: [{ service: "sleep", args: ["8"] }] })).item!.id;
    await watchUntil(fylr.client, blocker, "the blocker to hold the only slot", inState(ItemState.RUNNING));
    const submittedAt = Date.now();
    const waiting = (await fylr.client.submit({ calls: [{ service: "cat" }] })).item!.id;
    await watchUntil(
      fylr.client,
      waiting,
      "the waiting item to be given back",
      (u) => u.item?.state === ItemState.QUEUED && u.item.startAfter !== undefined && timestampDate(u.item.startAfter).getTime() > submittedAt + 30_000,
      20_000,
    );
    const row = (await rows()).find((x) => x.id === waiting)!;
    expect(row.attempts, "the attempt is given back").to.equal(0);
    expect(row.claimed_by).to.equal(null);
    // One minute (dispatcher.noSlotDelay) after the give-back, measured by the database clock.
    expect(row.start_after.getTime() - submittedAt).to.be.within(55_000, 75_000);
    expect(Number((await fylr.client.stats({})).requeuedTotal)).to.be.at.least(1);
    // The execserver's load comes from its GetStatus (cached up to a second, fetched by the
    // fylr): until the fylr has it, the line has no "running" part. Wait for the full line.
    const line = /^not before \S+ \(in (1m|\d+s)\); 1 running, 0 waiting - you are number 2/;
    let summary: string | undefined;
    await waitFor("the position line with the execserver's load", async () => {
      summary = (await fylr!.client.position({ id: waiting })).position?.summary;
      return summary !== undefined && line.test(summary) ? summary : undefined;
    }, 10_000, 250).catch((err: Error) => {
      throw new Error(`${err.message}; last line: ${summary}`);
    });
  });
});
