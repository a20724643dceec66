// QueueService's control over items on a real fylr and Postgres: List (filters, keyset
// pages, the cap, the index behind it), Retry, Delete with the stored data an item owns,
// and the JSON forms curl uses.
import { expect } from "chai";
import { execFile } from "node:child_process";
import { promisify } from "node:util";
import { Code, ConnectError } from "@connectrpc/connect";
import { timestampFromDate } from "@bufbuild/protobuf/wkt";
import { ItemState, type Item } from "../../gen/slotbroker/v1/queue_pb.js";
import { createQueueClient, followItem, type QueueClient } from "../../src/api/index.js";
import type { FylrHandle } from "../../src/app/index.js";
import { startExecserver, type ExecserverHandle } from "../../src/app/execserver.js";
import { listQuery, maxPageSize, migrate } from "../../src/dispatcher/index.js";
import { compileExecserverConfig } from "../../src/execserver/index.js";
import { createPgPool } from "../../src/shared/postgres.js";
import { waitFor } from "../../harness/execserver-process.js";
import { createTestDatabase } from "../support/postgres.js";
import { track } from "../../harness/resources.js";
import { requireTool } from "../../harness/system-tools.js";
import { closeAll, fastFylrConfig, openPool, startTestFylr } from "../integration/support.js";

const execFileP = promisify(execFile);

async function expectCode(promise: Promise<unknown>, code: Code, message?: RegExp): Promise<void> {
  try {
    await promise;
  } catch (err) {
    const e = ConnectError.from(err);
    expect(Code[e.code], e.message).to.equal(Code[code]);
    if (message) expect(e.rawMessage).to.match(message);
    return;
  }
  expect.fail(`expected ${Code[code]}`);
}

async function curlJson(base: string, method: string, body: unknown): Promise<{ status: number; json: Record<string, unknown> }> {
  const { stdout } = await execFileP(requireTool("curl"), [
    "-s", "-w", "\n%{http_code}", "-X", "POST", "-H", "Content-Type: application/json", "-d", JSON.stringify(body),
    `${base}/slotbroker.v1.QueueService/${method}`,
  ]);
  const at = stdout.lastIndexOf("\n");
  return { status: Number(stdout.slice(at + 1)), json: JSON.parse(stdout.slice(0, at)) as Record<string, unknown> };
}

describe("QueueService: List, Retry, Delete", function () {
  this.timeout(60_000);
  let databaseUrl: string;
  let exec: ExecserverHandle;
  let fylr: FylrHandle;
  let client: QueueClient;
  const later = () => timestampFromDate(new Date(Date.now() + 3_600_000));

  before(async () => {
    databaseUrl = await createTestDatabase("api_control");
  });
  beforeEach(async () => {
    const pool = createPgPool({ connectionString: databaseUrl, max: 1 });
    try {
      await migrate(pool);
      await pool.query("TRUNCATE queue_items, fylrs CASCADE");
    } finally {
      await pool.end();
    }
    const config = compileExecserverConfig(
      {
        instanceId: "control-exec",
        listen: "127.0.0.1:0",
        adminListen: "127.0.0.1:0",
        waitgroups: { text: { processes: 2 } },
        services: {
          cat: { waitgroup: "text", command: ["cat"] },
          fail: { waitgroup: "text", command: ["sh", "-c", "echo broken >&2; exit 3"] },
        },
      },
      "test",
    );
    exec = track(await startExecserver(config, { helloCoalesceMs: 5 }), "execserver control-exec", (h) => h.forceClose());
    fylr = await startTestFylr(fastFylrConfig(databaseUrl, [exec.grpcAddress], { store: { inlineBytes: "1KiB" } }));
    client = createQueueClient(fylr.url);
    await waitFor("the fylr to see the execserver", () => fylr.broker.instances().length === 1);
  });
  afterEach(async () => closeAll(fylr, exec));

  it("lists newest first in keyset pages, filtered by state, service, priority and time", async () => {
    const made: Item[] = [];
    for (let i = 0; i < 7; i++) {
      const service = i % 2 === 0 ? "cat" : "fail";
      made.push((await client.submit({ calls: [{ service }], priority: i, startAfter: later() })).item!);
    }
    await client.cancel({ id: made[1]!.id });
    await client.cancel({ id: made[4]!.id });
    const seen: string[] = [];
    let token = "";
    let pages = 0;
    do {
      const page = await client.list({ pageSize: 3, pageToken: token });
      seen.push(...page.items.map((item) => item.id));
      token = page.nextPageToken;
      pages++;
    } while (token);
    expect(pages).to.equal(3);
    expect(seen).to.deep.equal(made.map((m) => m.id).reverse());
    const cancelled = await client.list({ states: [ItemState.CANCELLED] });
    expect(cancelled.items.map((i) => i.id)).to.deep.equal([made[4]!.id, made[1]!.id]);
    expect(cancelled.nextPageToken).to.equal("");
    const cats = await client.list({ service: "cat", states: [ItemState.QUEUED] });
    expect(cats.items.map((i) => i.id)).to.deep.equal([made[6]!.id, made[2]!.id, made[0]!.id]);
    const urgent = await client.list({ minPriority: 3, maxPriority: 5 });
    expect(urgent.items.map((i) => i.priority)).to.deep.equal([5, 4, 3]);
    const none = await client.list({ createdBefore: made[0]!.createdAt });
    expect(none.items).to.have.length(0);
    const since = await client.list({ createdAfter: made[6]!.createdAt });
    expect(since.items.map((i) => i.id)).to.deep.equal([made[6]!.id]);
    // Outputs are left out of a listing.
    expect(cats.items.every((i) => i.output.length === 0)).to.equal(true);
    await expectCode(client.list({ pageToken: "garbage" }), Code.InvalidArgument, /page_token/);
  });

  it("caps the page size and backs every filter with an index (no sort, no OFFSET)", async () => {
    expect(listQuery({ pageSize: 100_000 }).pageSize).to.equal(maxPageSize);
    expect(listQuery({}).text).to.not.match(/OFFSET/i);
    const pool = openPool(databaseUrl, 1);
    const db = await pool.connect();
    try {
      // A tiny table would be scanned whole; forbid that to see which index the plan uses.
      await db.query("SET enable_seqscan = off");
      for (const [filter, index] of [
        [{ pageToken: undefined }, "queue_items_list_state_idx"],
        [{ states: ["cancelled" as const] }, "queue_items_list_state_idx"],
        [{ states: ["failed" as const, "cancelled" as const], minPriority: 2 }, "queue_items_list_state_idx"],
        [{ service: "cat" }, "queue_items_list_service_idx"],
      ] as const) {
        const q = listQuery(filter);
        const plan = (await db.query<{ "QUERY PLAN": string }>(`EXPLAIN ${q.text}`, q.values)).rows.map((r) => r["QUERY PLAN"]).join("\n");
        expect(plan, plan).to.include(index);
        // No Sort node (a Merge Append's "Sort Key" merges ranges already in order).
        expect(plan, plan).to.not.match(/(^|->)\s*Sort\s+\(/m);
      }
    } finally {
      db.release();
      await closeAll(pool);
    }
  });

  it("retries a failed item with fresh attempts", async () => {
    const { item } = await client.submit({ calls: [{ service: "fail" }], maxAttempts: 1 });
    const failed = await followItem(client, item!.id);
    expect(ItemState[failed.state]).to.equal("FAILED");
    await expectCode(client.cancel({ id: item!.id }), Code.FailedPrecondition, /is failed: only a queued, claimed or running item/);
    await expectCode(client.delete({ id: (await client.submit({ calls: [{ service: "cat" }], startAfter: later() })).item!.id }), Code.FailedPrecondition, /is queued/);
    const retried = (await client.retry({ id: item!.id })).item!;
    expect(ItemState[retried.state]).to.equal("QUEUED");
    expect(retried.attempts).to.equal(0);
    expect(retried.error).to.equal("");
    expect(retried.results).to.have.length(0);
    const again = await followItem(client, item!.id);
    expect(ItemState[again.state]).to.equal("FAILED");
    expect(again.attempts).to.equal(1);
  });

  it("delete removes a finished item with its stored input and output; retry keeps the input", async () => {
    const input = Buffer.alloc(5000, "x");
    const upload = await fetch(`${fylr.url}/queue/inputs`, { method: "POST", body: input });
    const { id: uploadId } = (await upload.json()) as { id: string };
    const { item } = await client.submit({ calls: [{ service: "cat", stdin: { case: "stdinUpload", value: uploadId } }] });
    const done = await followItem(client, item!.id);
    expect(ItemState[done.state], done.error).to.equal("SUCCEEDED");
    expect(done.outputStored).to.equal(true);
    const pool = openPool(databaseUrl, 1);
    const blobsOf = async (id: string): Promise<string[]> =>
      (await pool.query<{ role: string }>("SELECT role FROM blobs WHERE item_id = $1 ORDER BY role", [id])).rows.map((r) => r.role);
    expect(await blobsOf(item!.id)).to.deep.equal(["input", "output"]);
    await expectCode(
      client.submit({ calls: [{ service: "cat", stdin: { case: "stdinUpload", value: uploadId } }] }),
      Code.FailedPrecondition,
      /another item took it/,
    );
    await expectCode(client.retry({ id: item!.id }), Code.FailedPrecondition, /is succeeded/);
    const { blobsDeleted } = await client.delete({ id: item!.id });
    expect(blobsDeleted).to.equal(2);
    expect(await blobsOf(item!.id)).to.deep.equal([]);
    const chunks = await pool.query<{ n: number }>("SELECT count(*)::int AS n FROM blob_chunks");
    expect(chunks.rows[0]!.n).to.equal(0);
    await expectCode(client.delete({ id: item!.id }), Code.NotFound);

    // Cancelled, then retried: the uploaded input stays with the item and is read again.
    const upload2 = await fetch(`${fylr.url}/queue/inputs`, { method: "POST", body: input });
    const { id: upload2Id } = (await upload2.json()) as { id: string };
    const later2 = later();
    const parked = (await client.submit({ calls: [{ service: "cat", stdin: { case: "stdinUpload", value: upload2Id } }], startAfter: later2 })).item!;
    await client.cancel({ id: parked.id });
    expect(await blobsOf(parked.id)).to.deep.equal(["input"]);
    await client.retry({ id: parked.id });
    const rerun = await followItem(client, parked.id);
    expect(ItemState[rerun.state], rerun.error).to.equal("SUCCEEDED");
    expect(Number(rerun.outputSize)).to.equal(input.length);
    expect(await blobsOf(parked.id)).to.deep.equal(["input", "output"]);
    await closeAll(pool);
  });

  it("forgets a finished item queue.retention after it finished: NOT_FOUND for Get, Position and Watch, gone from List, its key free", async () => {
    // A second fylr with a short retention sweeps; any fylr may, the first keeps the default.
    const sweeper = await startTestFylr(fastFylrConfig(databaseUrl, [exec.grpcAddress], { queue: { retention: "500ms", sweepInterval: "100ms" } }));
    const { item } = await client.submit({ calls: [{ service: "cat" }], idempotencyKey: "nightly-report" });
    expect(ItemState[(await followItem(client, item!.id)).state]).to.equal("SUCCEEDED");
    const waiting = (await client.submit({ calls: [{ service: "cat" }], startAfter: later() })).item!;
    await waitFor("the sweep to delete the finished item", async () => (await client.list({})).items.every((i) => i.id !== item!.id));
    await expectCode(client.get({ id: item!.id }), Code.NotFound, /not found/);
    await expectCode(client.position({ id: item!.id }), Code.NotFound, /not found/);
    await expectCode((async () => { for await (const _ of client.watch({ id: item!.id })) expect.fail("a watch of a deleted item answered"); })(), Code.NotFound, /not found/);
    expect((await fetch(`${fylr.url}/queue/items/${item!.id}/output`)).status).to.equal(404);
    // Open items stay, and the key makes a new item.
    expect((await client.list({})).items.map((i) => i.id)).to.deep.equal([waiting.id]);
    const again = await client.submit({ calls: [{ service: "cat" }], idempotencyKey: "nightly-report", startAfter: later() });
    expect(again.created).to.equal(true);
    expect(again.item!.id).to.not.equal(item!.id);
    expect(sweeper.dispatcher.stats().counters.finishedDeleted + fylr.dispatcher.stats().counters.finishedDeleted).to.equal(1);
    await closeAll(sweeper);
  });

  it("answers Cancel and List as JSON over plain HTTP (the curl examples in docs/protocol.md)", async () => {
    const { item } = await client.submit({ calls: [{ service: "cat" }], startAfter: later() });
    // Refused while it waits for its start_after (a retried item may run and finish at once).
    const refused = await curlJson(fylr.url, "Delete", { id: item!.id });
    expect(refused.status).to.equal(400);
    expect(refused.json.code).to.equal("failed_precondition");
    const cancel = await curlJson(fylr.url, "Cancel", { id: item!.id });
    expect(cancel.status).to.equal(200);
    expect((cancel.json.item as { state: string }).state).to.equal("ITEM_STATE_CANCELLED");
    const list = await curlJson(fylr.url, "List", { states: ["ITEM_STATE_CANCELLED"], pageSize: 10 });
    expect(list.status).to.equal(200);
    expect((list.json.items as { id: string }[]).map((i) => i.id)).to.deep.equal([item!.id]);
    const retry = await curlJson(fylr.url, "Retry", { id: item!.id });
    expect((retry.json.item as { state: string }).state).to.equal("ITEM_STATE_QUEUED");
  });
});
