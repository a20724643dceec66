// QueueService end to end: a real fylr (in this process) on a real Postgres, running items
// on a real execserver, called through the Connect client and through curl's JSON.
import { expect } from "chai";
import { timestampFromDate } from "@bufbuild/protobuf/wkt";
import { execFile } from "node:child_process";
import { createHash } from "node:crypto";
import { promisify } from "node:util";
import { Code, ConnectError } from "@connectrpc/connect";
import { toJsonString } from "@bufbuild/protobuf";
import { ItemState, WatchResponseSchema, type Item, type WatchResponse } from "../../gen/slotbroker/v1/queue_pb.js";
import { migrate } from "../../src/dispatcher/index.js";
import { createQueueClient, type QueueClient } from "../../src/api/index.js";
import type { FylrHandle } from "../../src/app/index.js";
import { compileExecserverConfig } from "../../src/execserver/index.js";
import { startExecserver, type ExecserverHandle } from "../../src/app/execserver.js";
import { awaitCondition, eventsOf } from "../support/event-monitor.js";
import { inState, watchUntil } from "../support/watch-item.js";
import { createTestDatabase } from "../support/postgres.js";
import { track } from "../../harness/resources.js";
import { closeAll, fastFylrConfig, startTestFylr } from "../integration/support.js";
import { createPgPool } from "../../src/shared/postgres.js";
import { requireTool } from "../../harness/system-tools.js";

const execFileP = promisify(execFile);

async function startExec(): Promise<ExecserverHandle> {
  const config = compileExecserverConfig(
    {
      instanceId: "api-exec",
      listen: "127.0.0.1:0",
      adminListen: "127.0.0.1:0",
      waitgroups: { one: { processes: 1 }, text: { processes: 2 } },
      services: {
        sleep: { waitgroup: "one", command: ["sleep"], timeout: "1m" },
        cat: { waitgroup: "text", command: ["cat"] },
        sha256sum: { waitgroup: "text", command: ["sha256sum"] },
        wc: { waitgroup: "text", command: ["wc", "-c"] },
        fail: { waitgroup: "text", command: ["sh", "-c", "echo broken >&2; exit 3"] },
      },
    },
    "test",
  );
  return track(await startExecserver(config, { helloCoalesceMs: 5 }), "execserver api-exec", (h) => h.forceClose());
}

/** curl -X POST JSON to a QueueService method; resolves with the HTTP status and the parsed body. */
async function curlJson(base: string, method: string, body: unknown): Promise<{ status: number; json: Record<string, unknown> }> {
  const { stdout } = await execFileP(requireTool("curl"), [
    "-s",
    "-w",
    "\n%{http_code}",
    "-X",
    "POST",
    "-H",
    "Content-Type: application/json",
    "-d",
    JSON.stringify(body),
    `${base}/slotbroker.v1.QueueService/${method}`,
  ]);
  const at = stdout.lastIndexOf("\n");
  return { status: Number(stdout.slice(at + 1)), json: JSON.parse(stdout.slice(0, at)) as Record<string, unknown> };
}

async function expectCode(promise: Promise<unknown>, code: Code, message?: RegExp): Promise<ConnectError> {
  try {
    await promise;
  } catch (err) {
    const e = ConnectError.from(err);
    expect(Code[e.code], e.message).to.equal(Code[code]);
    if (message) expect(e.rawMessage).to.match(message);
    return e;
  }
  throw new Error(`expected ${Code[code]}, but the call succeeded`);
}

async function finished(client: QueueClient, id: string): Promise<Item> {
  return (await watchUntil(client, id, `item ${id} to finish`, inState(ItemState.SUCCEEDED, ItemState.FAILED))).item!;
}

describe("QueueService on a fylr", () => {
  let databaseUrl: string;
  let exec: ExecserverHandle;
  let fylr: FylrHandle;
  let client: QueueClient;

  before(async () => {
    databaseUrl = await createTestDatabase("api");
  });
  beforeEach(async () => {
    const pool = createPgPool({ connectionString: databaseUrl, max: 1 });
    try {
      await migrate(pool);
      await pool.query("TRUNCATE queue_items, fylrs CASCADE");
    } finally {
      await pool.end();
    }
    exec = await startExec();
    fylr = await startTestFylr(fastFylrConfig(databaseUrl, [exec.grpcAddress], { dispatcher: { headroom: 0 } }));
    client = createQueueClient(fylr.url);
    await awaitCondition("the fylr to see the execserver", [eventsOf(fylr.broker.events, "instances")], () => fylr.broker.instances().length === 1);
  });
  afterEach(async () => {
    await closeAll(fylr, exec);
  });

  it("runs a submitted chain on the execserver and stores the output and one receipt per call", async () => {
    const input = Buffer.from("hello slotbroker\n");
    const { item, created } = await client.submit({
      calls: [
        { service: "cat", stdin: { case: "stdinData", value: input } },
        { service: "sha256sum", stdin: { case: "stdinFromPrevious", value: true } },
      ],
      priority: 3,
    });
    expect(created).to.equal(true);
    expect(item?.state).to.equal(ItemState.QUEUED);
    // The answer does not echo the inline stdin; Get returns it.
    expect(item!.calls[0]!.stdin).to.deep.equal({ case: "stdinData", value: new Uint8Array(0) });
    const got = (await client.get({ id: item!.id })).item!;
    expect(got.calls[0]!.stdin).to.deep.equal({ case: "stdinData", value: new Uint8Array(input) });
    const done = await finished(client, item!.id);
    expect(done.state, done.error).to.equal(ItemState.SUCCEEDED);
    const digest = createHash("sha256").update(input).digest("hex");
    expect(Buffer.from(done.output).toString()).to.equal(`${digest}  -\n`);
    expect(done.results.map((r) => [r.service, r.receipt?.exitCode, r.receipt?.instanceId])).to.deep.equal([
      ["cat", 0, "api-exec"],
      ["sha256sum", 0, "api-exec"],
    ]);
    expect(done.attempts).to.equal(1);
    expect(done.finishedAt).to.not.equal(undefined);
  });

  it("takes a curl JSON Submit and answers Get, Position and Stats as JSON", async () => {
    const submitted = await curlJson(fylr.url, "Submit", { calls: [{ service: "wc", stdinData: Buffer.from("12345").toString("base64") }] });
    expect(submitted.status).to.equal(200);
    const id = (submitted.json.item as { id: string }).id;
    await finished(client, id);
    const got = await curlJson(fylr.url, "Get", { id });
    expect(got.status).to.equal(200);
    const item = got.json.item as { state: string; output: string; results: { receipt: { exitCode?: number } }[] };
    expect(item.state).to.equal("ITEM_STATE_SUCCEEDED");
    expect(Buffer.from(item.output, "base64").toString().trim()).to.equal("5");
    expect(item.results[0]!.receipt.exitCode ?? 0).to.equal(0);
    const position = await curlJson(fylr.url, "Position", { id });
    expect(position.json).to.deep.equal({ position: { state: "ITEM_STATE_SUCCEEDED", summary: "succeeded" } });
    const stats = await curlJson(fylr.url, "Stats", {});
    expect(stats.json.fylrId).to.equal(fylr.id);
    expect(stats.json.claimedTotal).to.equal("1");
    expect(stats.json.shares).to.deep.equal([{ instanceId: "api-exec", address: exec.grpcAddress, capacity: 3, clients: 1, share: 3 }]);
  });

  it("returns the first item for a repeated idempotency key, with created = false", async () => {
    const request = { calls: [{ service: "cat" }], idempotencyKey: "order-42" };
    const first = await client.submit(request);
    const again = await client.submit({ ...request, priority: 9 });
    expect(first.created).to.equal(true);
    expect(again.created).to.equal(false);
    expect(again.item?.id).to.equal(first.item?.id);
    expect(again.item?.priority).to.equal(0);
    const json = await curlJson(fylr.url, "Submit", request);
    expect(json.json.item).to.have.property("id", first.item?.id);
    expect(json.json).to.not.have.property("created");
  });

  it("stores a fairness key, weight and limit, shows them in Get and List, and lists by key", async () => {
    const { item } = await client.submit({ calls: [{ service: "cat", stdin: { case: "stdinData", value: Buffer.from("k") } }], fairnessKey: "tenant-ä", fairnessWeight: 3, fairnessLimit: 4 });
    expect([item?.fairnessKey, item?.fairnessWeight, item?.fairnessLimit]).to.deep.equal(["tenant-ä", 3, 4]);
    const plain = (await client.submit({ calls: [{ service: "cat", stdin: { case: "stdinData", value: Buffer.from("p") } }] })).item!;
    expect([plain.fairnessKey, plain.fairnessWeight, plain.fairnessLimit]).to.deep.equal(["", 1, 0]);
    const got = (await client.get({ id: item!.id })).item!;
    expect([got.fairnessKey, got.fairnessWeight, got.fairnessLimit]).to.deep.equal(["tenant-ä", 3, 4]);
    expect((await client.list({ fairnessKey: "tenant-ä" })).items.map((i) => i.id)).to.deep.equal([item!.id]);
    expect((await client.list({ fairnessKey: "" })).items.map((i) => i.id)).to.include(plain.id).and.not.include(item!.id);
    const badList = await curlJson(fylr.url, "List", { fairnessKey: "a\u0000b" });
    expect([badList.status, badList.json.message]).to.deep.equal([400, "fairness_key: at most 128 bytes of UTF-8, no NUL character"]);
    // Per-key counts: held items of one key waiting for a slot; most queued first.
    const later = timestampFromDate(new Date(Date.now() + 3_600_000));
    const waiting: string[] = [];
    for (let i = 0; i < 3; i++) waiting.push((await client.submit({ calls: [{ service: "cat" }], fairnessKey: "tenant-q", startAfter: later })).item!.id);
    const keys = await client.listKeys({});
    expect(keys.keys[0]).to.deep.include({ fairnessKey: "tenant-q", queued: 3, held: 0 });
    expect(keys.keys[0]!.oldestQueued).to.not.equal(undefined);
    expect(keys.keysQueued).to.be.at.least(1);
    expect((await client.listKeys({ limit: 1 })).keys).to.have.length(1);
    for (const id of waiting) await client.cancel({ id });
  });

  it("refuses bad input with INVALID_ARGUMENT naming the field, never a 500", async () => {
    const cases: [unknown, RegExp][] = [
      [{ calls: [{ service: "cat" }, { service: "wc" }, { service: "cat", stdinUrl: "ftp://x/y" }] }, /^calls\[2\]\.stdin_url: must be http\(s\)/],
      [{ calls: [{ service: "cat", stdinFromPrevious: true }] }, /^calls\[0\]\.stdin_from_previous: /],
      [{ calls: [{ service: "cat" }, { service: "" }] }, /^calls\[1\]\.service: /],
      [{ calls: [{ service: "cat" }, { service: "ffmpeg" }] }, /^calls\[1\]\.service: no connected execserver offers "ffmpeg"/],
      [{ calls: [{ service: "cat", env: { "1BAD": "x" } }] }, /^calls\[0\]\.env: invalid variable name "1BAD"/],
      [{ local: { name: "nope" } }, /^local\.name: unknown local action "nope"/],
      [{ local: { name: "checksum", params: { algorithm: "rot13" } } }, /^local\.params: algorithm: /],
      [{ calls: [{ service: "cat" }], local: { name: "checksum" } }, /either calls or local/],
      [{}, /one or more calls, or a local action/],
      [{ calls: [{ service: "cat" }], maxAttempts: 5000 }, /^max_attempts: /],
      [{ calls: [{ service: "cat" }], fairnessKey: "k".repeat(129) }, /^fairness_key: longer than 128 bytes/],
      [{ calls: [{ service: "cat" }], fairnessWeight: 1001 }, /^fairness_weight: must be 1…1000/],
      [{ calls: [{ service: "cat" }], fairnessLimit: 2_000_000 }, /^fairness_limit: /],
    ];
    for (const [body, message] of cases) {
      const { status, json } = await curlJson(fylr.url, "Submit", body);
      expect(status, JSON.stringify(body)).to.equal(400);
      expect(json.code).to.equal("invalid_argument");
      expect(json.message).to.match(message);
    }
    const typed = await curlJson(fylr.url, "Submit", { calls: [{ service: "cat" }], priority: "urgent" });
    expect(typed.status).to.equal(400);
    expect(typed.json.message).to.match(/priority/);
    const count = await fylr.dispatcher.queue.countOpen();
    expect(count, "nothing was queued").to.deep.equal([]);
  });

  it("refuses JSON with an unknown field (a typo) with 400 naming it, top-level or nested, and queues nothing", async () => {
    const cases: [string, unknown, RegExp][] = [
      ["Submit", { calls: [{ service: "wc", stdinDta: "aGVsbG8K" }], priorty: 9 }, /slotbroker\.v1\.ExecCall.*"stdinDta" is unknown/],
      ["Submit", { calls: [{ service: "wc", stdinData: "aGVsbG8K" }], priorty: 9 }, /slotbroker\.v1\.SubmitRequest.*"priorty" is unknown/],
      ["Submit", { local: { name: "checksum", inptu: "aGk=" } }, /slotbroker\.v1\.LocalAction.*"inptu" is unknown/],
      ["Get", { idd: "7d5b8a2e-2f1b-4f53-9c1e-0d2b8b1c9a77" }, /slotbroker\.v1\.GetRequest.*"idd" is unknown/],
    ];
    for (const [method, body, message] of cases) {
      const { status, json } = await curlJson(fylr.url, method, body);
      expect(status, JSON.stringify(body)).to.equal(400);
      expect(json.code).to.equal("invalid_argument");
      expect(json.message).to.match(message);
    }
    expect(await fylr.dispatcher.queue.countOpen(), "nothing was queued").to.deep.equal([]);
    // Both spellings protobuf JSON defines are fields, not typos.
    const snake = await curlJson(fylr.url, "Submit", { calls: [{ service: "wc", stdin_data: "aGVsbG8K" }], max_attempts: 2 });
    expect(snake.status).to.equal(200);
    const item = await finished(client, (snake.json.item as { id: string }).id);
    expect(Buffer.from(item.output).toString().trim()).to.equal("6");
  });

  it("answers NOT_FOUND for an unknown id and INVALID_ARGUMENT for a malformed one, on every call", async () => {
    const unknown = "7d5b8a2e-2f1b-4f53-9c1e-0d2b8b1c9a77";
    await expectCode(client.get({ id: unknown }), Code.NotFound, /not found/);
    await expectCode(client.position({ id: unknown }), Code.NotFound);
    await expectCode(drain(client.watch({ id: unknown })), Code.NotFound);
    await expectCode(client.get({ id: "42" }), Code.InvalidArgument, /^id: not a UUID/);
    await expectCode(client.position({ id: "" }), Code.InvalidArgument, /^id: /);
    await expectCode(drain(client.watch({ id: "x'; DROP TABLE queue_items" })), Code.InvalidArgument);
    const { status } = await curlJson(fylr.url, "Get", { id: "nope" });
    expect(status).to.equal(400);
  });

  it("Watch emits every state change with the position and ends after SUCCEEDED", async () => {
    const { item } = await client.submit({ calls: [{ service: "sleep", args: ["0.3"] }] });
    const updates = await drain(client.watch({ id: item!.id }));
    const states = updates.map((u) => ItemState[u.item!.state]);
    expect(states.at(-1)).to.equal("SUCCEEDED");
    expect(states).to.include("RUNNING");
    expect(states.filter((s) => s === "SUCCEEDED")).to.have.length(1);
    // Each update differs from the one before (no repeats of the same state and line).
    const json = updates.map((u) => toJsonString(WatchResponseSchema, u));
    for (let i = 1; i < json.length; i++) expect(json[i]).to.not.equal(json[i - 1]);
    expect(updates.every((u) => u.position !== undefined)).to.equal(true);
  });

  it("Watch follows an item that another fylr runs, through the database", async () => {
    const other = await startTestFylr(fastFylrConfig(databaseUrl, [exec.grpcAddress], { dispatcher: { headroom: 0 } }));
    try {
      // Only the other fylr may claim: this one stops its loop.
      await fylr.dispatcher.stop();
      const otherClient = createQueueClient(other.url);
      const { item } = await otherClient.submit({ calls: [{ service: "sleep", args: ["0.3"] }] });
      const updates = await drain(client.watch({ id: item!.id }));
      expect(updates.at(-1)?.item?.state).to.equal(ItemState.SUCCEEDED);
      expect(updates.at(-1)?.item?.claimedBy).to.equal("");
      const { item: stored } = await client.get({ id: item!.id });
      expect(stored?.state).to.equal(ItemState.SUCCEEDED);
      expect(other.dispatcher.stats().counters.succeeded).to.equal(1);
    } finally {
      await closeAll(other);
    }
  });

  it("Position merges the execserver's line with the database's: running, ahead, capacity and a summary", async () => {
    // One slot; admission is 3 (capacity 3, one client, headroom 0), so of five sleeps one
    // runs, two wait parked at the execserver and two wait in the database. One at a time,
    // each awaited in its place: submitted together, the first three are claimed in one pass
    // and their wants reach the execserver in any order.
    const sleep = { calls: [{ service: "sleep", args: ["30"] }] };
    const ids: string[] = [];
    const submitUntil = async (what: string, until: (u: WatchResponse) => boolean): Promise<void> => {
      const id = (await client.submit(sleep)).item!.id;
      ids.push(id);
      await watchUntil(client, id, what, until);
    };
    const parkedAs = (n: number) => (u: WatchResponse) => u.item?.state === ItemState.CLAIMED && new RegExp(` waiting - you are number ${n}\\b`).test(u.position?.summary ?? "");
    await submitUntil("the first to run", (u) => u.item?.state === ItemState.RUNNING);
    await submitUntil("the second to be parked first in line", parkedAs(2));
    await submitUntil("the third to be parked behind it", parkedAs(3));
    await submitUntil("the fourth to wait in the database", (u) => u.item?.state === ItemState.QUEUED && u.position?.ahead === 2);
    await submitUntil("the fifth to wait behind it", (u) => u.item?.state === ItemState.QUEUED && u.position?.ahead === 3);
    const positions = await Promise.all(ids.map(async (id) => (await client.position({ id })).position!));
    const [running, first, second, q1, q2] = positions;
    const shown = positions.map((p) => `${ItemState[p.state]} ${p.summary}`).join("\n");
    expect(running!.state).to.equal(ItemState.RUNNING);
    expect(running!.summary).to.match(/^running sleep on api-exec/);
    expect([first!.aheadAtExecserver, first!.aheadInQueue, first!.ahead], shown).to.deep.equal([0, 0, 0]);
    expect([second!.aheadAtExecserver, second!.aheadInQueue, second!.ahead], shown).to.deep.equal([1, 0, 1]);
    expect(second!.summary).to.match(/^1 running, 1 waiting - you are number 3/);
    // Not parked yet: the two wants at the execserver are ahead, plus the queue before it.
    expect([q1!.aheadInQueue, q1!.aheadAtExecserver, q1!.ahead, q1!.running, q1!.capacity]).to.deep.equal([0, 2, 2, 1, 1]);
    expect([q2!.aheadInQueue, q2!.aheadAtExecserver, q2!.ahead]).to.deep.equal([1, 2, 3]);
    expect(q2!.summary).to.match(/^1 running, 3 waiting - you are number 5/);
  });

  it("reports a failed item with its receipt and error", async () => {
    const { item } = await client.submit({ calls: [{ service: "fail" }], maxAttempts: 1 });
    const done = await finished(client, item!.id);
    expect(done.state).to.equal(ItemState.FAILED);
    expect(done.error).to.equal("calls[0] (fail): exited with code 3: broken");
    expect(done.results[0]?.receipt?.stderrLine).to.equal("broken");
    const { position } = await client.position({ id: item!.id });
    expect(position?.summary).to.equal("failed: calls[0] (fail): exited with code 3: broken");
  });

  it("serves /metrics and /status.json next to the API", async () => {
    const { item } = await client.submit({ local: { name: "checksum", input: Buffer.from("x") } });
    await finished(client, item!.id);
    const metrics = await (await fetch(`${fylr.url}/metrics`)).text();
    expect(metrics).to.match(/^slotbroker_fylr_claims_total\{fylr_id="[^"]+"\} 1$/m);
    expect(metrics).to.match(/^slotbroker_fylr_pool_connections\{address="127\.0\.0\.1:\d+",state="ready",fylr_id="[^"]+"\} 1$/m);
    const status = (await (await fetch(`${fylr.url}/status.json`)).json()) as { fylrs: { id: string }[]; execservers: { addresses: string[] } };
    expect(status.fylrs.map((f) => f.id)).to.deep.equal([fylr.id]);
    expect(status.execservers.addresses).to.deep.equal([exec.grpcAddress]);
  });
});

async function drain(stream: AsyncIterable<WatchResponse>): Promise<WatchResponse[]> {
  const out: WatchResponse[] = [];
  for await (const update of stream) out.push(update);
  return out;
}
