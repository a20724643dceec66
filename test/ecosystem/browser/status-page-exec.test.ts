import { create } from "@bufbuild/protobuf";
import * as grpc from "@grpc/grpc-js";
import { expect } from "chai";
import type { Browser, Page } from "playwright-core";
import { BrokerService, ConnectRequestSchema, type ConnectRequest, type ConnectResponse, type GetStatusResponse } from "../../../gen/slotbroker/v1/broker_pb.js";
import { grpcClientConstructor } from "../../../src/shared/grpc.js";
import { jainIndex, type StatusViewJson } from "../../../src/status-pages/index.js";
import { BrokerStream, closeLater, eventually, releaseAll } from "../../execserver/support/broker-stream.js";
import { startTestServer } from "../../execserver/support/server.js";
import { release, track } from "../../../harness/resources.js";
import { launchBrowser, openPage, screenshot } from "./browser.js";

// waitgroup one: 1 slot (noop), two: 2 slots (noop2), slow: 3 slots (the real `sleep`).
const layout = { waitgroups: { one: { processes: 1 }, two: { processes: 2 }, slow: { processes: 3 } }, offerTimeout: "1m" };

/** Takes `n` grants of a builtin service on one stream (WANT → OFFER → JOB → DONE). */
async function grants(stream: BrokerStream, service: string, n: number, prefix: string): Promise<void> {
  for (let i = 0; i < n; i++) {
    const id = `${prefix}-${i}`;
    stream.want(id, service);
    const offer = await stream.next("offer");
    stream.job(id, offer.offerToken);
    await stream.next("done");
  }
}

/** Starts a `sleep 60` on the stream: a slot that stays running. */
async function runSleep(stream: BrokerStream, id: string): Promise<void> {
  stream.want(id, "sleep");
  const offer = await stream.next("offer");
  stream.job(id, offer.offerToken, { args: ["60"] });
  await stream.ping();
}

async function slotBoxes(page: Page, waitgroup: string): Promise<Record<string, number>> {
  const boxes = page.locator(`[data-waitgroup="${waitgroup}"] .boxes .box`);
  const count = (state: string): Promise<number> => boxes.and(page.locator(`[data-state="${state}"]`)).count();
  return { total: await boxes.count(), running: await count("running"), offered: await count("offered"), free: await count("free") };
}

/**
 * Reads every bar of a chart in one evaluation: the page redraws itself on each live poll,
 * and measuring the rows one round trip at a time could catch a row between two drawings.
 */
async function barRows(page: Page, selector: string): Promise<{ key: string; value: number; width: number }[]> {
  // A string expression: tests have no DOM types.
  const rows = `[...document.querySelectorAll(${JSON.stringify(`${selector} .bar-row`)})]`;
  return page.evaluate<{ key: string; value: number; width: number }[]>(
    `${rows}.map((row) => ({ key: row.getAttribute("data-key") ?? "", value: Number(row.getAttribute("data-value")), ` +
      `width: row.querySelector(".bar-fill")?.getBoundingClientRect().width ?? -1 }))`,
  );
}

/** Waits (bounded) until a page expression is true; the expression is a string: tests have no DOM types. */
async function until(page: Page, expression: string, timeout = 5000): Promise<void> {
  await page.waitForFunction(expression, undefined, { timeout });
}

const Client = grpcClientConstructor(BrokerService);

/**
 * `n` broker streams over one HTTP/2 connection (cheap enough for a thousand), each named
 * `${prefix}-NNNN` and parking one want for `service` at priority i % 4. Tracked.
 */
function manyStreams(address: string, n: number, prefix: string, service: string): void {
  const client = new Client(address, grpc.credentials.createInsecure(), { "grpc.use_local_subchannel_pool": 1 });
  const connect = (client as unknown as { connect: (m: grpc.Metadata) => grpc.ClientDuplexStream<ConnectRequest, ConnectResponse> }).connect.bind(client);
  const calls: grpc.ClientDuplexStream<ConnectRequest, ConnectResponse>[] = [];
  for (let i = 0; i < n; i++) {
    const metadata = new grpc.Metadata();
    metadata.set("slotbroker-client", `${prefix}-${String(i).padStart(4, "0")}`);
    const call = connect(metadata);
    call.on("data", () => undefined);
    call.on("error", () => undefined);
    call.write(create(ConnectRequestSchema, { frame: { case: "want", value: { $typeName: "slotbroker.v1.Want", jobId: `w${i}`, service, priority: i % 4, fairnessKey: "", fairnessWeight: 0 } } }));
    calls.push(call);
  }
  closeLater(
    track(client, `${n} streams`, (c) => {
      for (const call of calls) call.cancel();
      c.close();
    }),
  );
}

describe("execserver status page (headless Chromium)", function () {
  this.timeout(60_000);
  let browser: Browser;

  before(async () => {
    browser = await launchBrowser();
  });
  after(() => release(browser));
  afterEach(releaseAll);

  it("draws slots, the book by priority and grants per connection as GetStatus reports them, and follows new grants live", async () => {
    const server = await startTestServer(layout);
    const alpha = await BrokerStream.open(server.grpcAddress, { clientName: "alpha" });
    await runSleep(alpha, "a1");
    await runSleep(alpha, "a2");
    // beta holds the third sleep slot as an unanswered offer and parks five more wants.
    const beta = await BrokerStream.open(server.grpcAddress, { clientName: "beta" });
    beta.want("b0", "sleep");
    const held = await beta.next("offer");
    for (const id of ["b1", "b2", "b3"]) beta.want(id, "sleep", 5);
    for (const id of ["b4", "b5"]) beta.want(id, "sleep", 0);
    await beta.ping();
    const gamma = await BrokerStream.open(server.grpcAddress, { clientName: "gamma" });
    await grants(gamma, "noop", 5, "g");
    // A client name that is markup: it must show up as text and never run.
    await BrokerStream.open(server.grpcAddress, { clientName: `<img src=x onerror="alert(1)">` });
    const status: GetStatusResponse = server.status();

    const { page, errors } = await openPage(browser, `${server.adminUrl}/`);
    expect(await page.title()).to.equal("execserver test-exec");
    expect(await page.locator('[data-name="instance-id"]').textContent()).to.equal("test-exec");

    // One box per slot, coloured as GetStatus counts them.
    expect(status.waitgroups.map((w) => w.name).sort()).to.deep.equal(["one", "slow", "two"]);
    for (const wg of status.waitgroups) {
      expect(await slotBoxes(page, wg.name), wg.name).to.deep.equal({ total: wg.processes, running: wg.running, offered: wg.offered, free: wg.free });
    }
    expect(await slotBoxes(page, "slow")).to.deep.equal({ total: 3, running: 2, offered: 1, free: 0 });

    // The book: priority 5 (three wants) above priority 0 (two), bars in proportion.
    const book = await barRows(page, '.book[data-waitgroup="slow"]');
    expect(book.map((b) => [b.key, b.value])).to.deep.equal([
      ["5", 3],
      ["0", 2],
    ]);
    expect(book[1]!.width / book[0]!.width).to.be.closeTo(2 / 3, 0.02);
    expect(await page.locator(".book").count(), "only waitgroups with parked wants").to.equal(1);

    // Grants per connection, most first, by client name; bar lengths follow the numbers.
    const bars = await barRows(page, '.bars[data-name="grants"]');
    expect(bars.map((b) => [b.key, b.value])).to.deep.equal([
      ["gamma", 5],
      ["alpha", 2],
      ["beta", 0],
      [`<img src=x onerror="alert(1)">`, 0],
    ]);
    expect(bars[1]!.width / bars[0]!.width).to.be.closeTo(2 / 5, 0.02);
    expect(bars[2]!.width).to.equal(0);

    // Fairness over the three connections that asked for slots (the silent one is left out).
    const expected = jainIndex([5, 2, 0])!;
    expect(Number(await page.locator('svg.gauge[data-name="jain"]').getAttribute("data-value"))).to.be.closeTo(expected, 1e-4);
    expect(await page.locator('.tile[data-name="fairness"] .tile-value').textContent()).to.equal(expected.toFixed(2));

    // The connections table has every stream, with counters, and the hostile name as text.
    const rows = page.locator("table.conns tbody tr");
    expect(await rows.count()).to.equal(4);
    expect(await page.locator('tr[data-client="beta"] td').allTextContents()).to.include.members(["5", "1"]);
    expect(await page.getByText(`<img src=x onerror="alert(1)">`).count()).to.be.greaterThan(0);
    expect(await page.locator("img").count(), "no element from a client name").to.equal(0);
    expect(await page.locator('[data-section="summary"] .tile[data-name="waiting"] .tile-value').textContent()).to.equal("5");
    await screenshot(page, "execserver");

    // Live: new grants on a new connection and beta's JOB show up without a reload.
    const polls = Number(await page.locator("#live").getAttribute("data-polls"));
    const delta = await BrokerStream.open(server.grpcAddress, { clientName: "delta" });
    await grants(delta, "noop2", 7, "d");
    beta.job("b0", held.offerToken, { args: ["60"] });
    await beta.ping();
    // Until the top bar is delta with all seven: a poll between its sixth and seventh grant
    // already puts delta on top (6 > beta's 5).
    await until(
      page,
      `(() => { const row = document.querySelector('.bars[data-name="grants"] .bar-row'); return row?.getAttribute("data-key") === "delta" && row.getAttribute("data-value") === "7"; })()`,
    );
    const after = await barRows(page, '.bars[data-name="grants"]');
    expect(after[0]).to.include({ key: "delta", value: 7 });
    await until(page, `document.querySelectorAll('[data-waitgroup="slow"] .box[data-state="running"]').length === 3`);
    expect(await slotBoxes(page, "slow")).to.deep.equal({ total: 3, running: 3, offered: 0, free: 0 });
    expect(Number(await page.locator("#live").getAttribute("data-polls"))).to.be.greaterThan(polls);
    expect(await page.locator("#live").getAttribute("class")).to.equal("live ok");
    await screenshot(page, "execserver-live");
    expect(errors).to.deep.equal([]);
  });

  it("shows legacy tokens and legacy jobs apart from broker offers and jobs", async () => {
    const server = await startTestServer({ ...layout, legacy: { enabled: true } });
    const stream = await BrokerStream.open(server.grpcAddress, { clientName: "new-fylr" });
    await runSleep(stream, "brokered");
    // One legacy job running (a PUT /job whose response is still open) and one token held.
    const token = async (): Promise<string> => ((await (await fetch(`${server.legacyUrl}/token/sleep`)).json()) as { token: string }).token;
    const job = encodeURIComponent(JSON.stringify({ args: ["60"] }));
    const put = new AbortController();
    fetch(`${server.legacyUrl}/job?token=${await token()}&job=${job}`, { method: "PUT", body: "", signal: put.signal }).catch(() => undefined);
    await eventually(() => expect(server.status().legacy?.jobsRunning).to.equal(1));
    await token();
    const { page, errors } = await openPage(browser, `${server.adminUrl}/`);
    try {
      const boxes = page.locator('[data-waitgroup="slow"] .boxes .box');
      const count = (state: string): Promise<number> => boxes.and(page.locator(`[data-state="${state}"]`)).count();
      expect({ running: await count("running"), legacy: await count("legacy"), token: await count("token"), free: await count("free") }).to.deep.equal({
        running: 1,
        legacy: 1,
        token: 1,
        free: 0,
      });
      expect(await page.locator('.tile[data-name="legacy-running"] .tile-value').textContent()).to.equal("1");
      expect(await page.locator('.tile[data-name="legacy-tokens"] .tile-value').textContent()).to.equal("1");
      expect(await page.locator(".legend").first().textContent()).to.contain("legacy token");
      await screenshot(page, "execserver-legacy");
      expect(errors).to.deep.equal([]);
    } finally {
      put.abort();
    }
  });

  it("shows draining while jobs finish, and says so when the execserver stops answering", async () => {
    const server = await startTestServer(layout);
    const { page, errors } = await openPage(browser, `${server.adminUrl}/status`);
    expect(await page.locator(".book").count()).to.equal(0);
    expect(await page.locator('[data-section="book"] .empty').textContent()).to.contain("empty");
    expect(await page.locator('[data-section="grants"] .empty').textContent()).to.contain("no broker streams");
    await until(page, `document.getElementById("live").className === "live ok"`);
    expect(await page.locator('[data-name="draining"]').count()).to.equal(0);
    const stream = await BrokerStream.open(server.grpcAddress, { clientName: "alpha" });
    await runSleep(stream, "nap");
    // A graceful close drains: the admin port keeps serving while the sleep runs.
    const closing = server.close();
    await page.waitForSelector('[data-name="draining"]', { timeout: 5000 });
    expect(await page.locator("header .pill").textContent()).to.equal("draining");
    await screenshot(page, "execserver-draining");
    await server.forceClose();
    await closing;
    await until(page, `document.getElementById("live").className === "live stale"`);
    expect(await page.locator("#live span").textContent()).to.match(/^no answer for \d+ s/);
    // The refused fetches are the point here; nothing else may have gone wrong.
    expect(errors.filter((e) => !e.includes("Failed to load resource") && !e.includes("ERR_CONNECTION_REFUSED"))).to.deep.equal([]);
  });

  it("stays readable with 1000 connections: the top 20 by grants, the 25 busiest, and how many more", async () => {
    const server = await startTestServer(layout);
    // Thirty named streams with 1, 2 or 3 grants (ten each), then 970 that park one want each.
    const granted: BrokerStream[] = [];
    for (let i = 0; i < 30; i++) {
      const stream = await BrokerStream.open(server.grpcAddress, { clientName: `busy-${String(i).padStart(2, "0")}` });
      await grants(stream, "noop2", 1 + (i % 3), `b${i}`);
      granted.push(stream);
    }
    manyStreams(server.grpcAddress, 970, "idle", "sleep");
    await eventually(() => expect(server.status().connections).to.have.length(1000), 20_000);
    await eventually(() => expect(server.status().waitgroups.find((w) => w.name === "slow")!.waiting).to.equal(967n), 10_000);
    const status = server.status();

    const view = await fetch(`${server.adminUrl}/status/view.json`);
    const body = await view.text();
    expect(body.length, "the view JSON stays small").to.be.below(120_000);
    expect(Object.keys((JSON.parse(body) as StatusViewJson).sections)).to.deep.equal(["header", "summary", "slots", "book", "legacy", "grants", "connections"]);

    const { page, errors } = await openPage(browser, `${server.adminUrl}/`);
    expect(await page.locator('.tile[data-name="connections"] .tile-value').textContent()).to.equal("1,000");
    const bars = await barRows(page, '.bars[data-name="grants"]');
    expect(bars).to.have.length(20);
    expect(bars.slice(0, 10).every((b) => b.value === 3)).to.equal(true);
    expect(await page.locator('[data-name="grants-more"]').getAttribute("data-more")).to.equal("980");
    expect(await page.locator('[data-name="grants-more"]').textContent()).to.equal("and 980 more connection(s) with 10 grant(s)");
    // The table: 25 rows, then one row that sums the other 975.
    expect(await page.locator("table.conns tbody tr[data-connection]").count()).to.equal(25);
    const more = page.locator('tr[data-name="connections-more"]');
    expect(await more.getAttribute("data-more")).to.equal("975");
    const parkedShown = (await page.locator("table.conns tbody tr[data-connection] td:nth-child(4)").allTextContents()).reduce((n, t) => n + Number(t), 0);
    const parkedRest = Number(await more.locator("td:nth-child(2)").textContent());
    expect(parkedShown + parkedRest).to.equal(Number(status.connections.reduce((n, c) => n + c.wantsParked, 0n)));
    // The book: four classes, most urgent first, summing to the parked wants.
    const book = await barRows(page, '.book[data-waitgroup="slow"]');
    expect(book.map((b) => b.key)).to.deep.equal(["3", "2", "1", "0"]);
    expect(book.reduce((n, b) => n + b.value, 0)).to.equal(967);
    const height = (await page.locator("main").boundingBox())!.height;
    expect(height, "one screenful or three, not a thousand rows").to.be.below(3000);
    await screenshot(page, "execserver-1000");
    expect(errors).to.deep.equal([]);
  });
});
