import { expect } from "chai";
import pg from "pg";
import type { Browser, Locator, Page } from "playwright-core";
import { timestampFromDate } from "@bufbuild/protobuf/wkt";
import { ItemState } from "../../../gen/slotbroker/v1/queue_pb.js";
import { createQueueClient, type QueueClient } from "../../../src/api/index.js";
import { compileFylrConfig, startFylr, type FylrConfigInput, type FylrHandle } from "../../../src/app/index.js";
import type { ExecserverHandle } from "../../../src/app/execserver.js";
import type { FylrPageData } from "../../../src/status-pages/index.js";
import { closeLater, eventually, releaseAll } from "../../execserver/support/broker-stream.js";
import { startTestServer } from "../../execserver/support/server.js";
import { createTestDatabase } from "../../support/postgres.js";
import { release, track } from "../../../harness/resources.js";
import { launchBrowser, openPage, screenshot } from "./browser.js";
import { createPgPool } from "../../../src/shared/postgres.js";

// Slots: one (1, noop), two (2, noop2), slow (2, the real `sleep`): capacity 5.
const layout = { waitgroups: { one: { processes: 1 }, two: { processes: 2 }, slow: { processes: 2 } }, offerTimeout: "1m" };

function fylrConfig(databaseUrl: string, address: string, name: string): FylrConfigInput {
  return {
    name,
    listen: "127.0.0.1:0",
    databaseUrl,
    databasePoolSize: 4,
    // A want waits a whole minute: parked items stay put while the test looks at them.
    execserver: { addresses: [address], connectTimeout: "1m", retryTick: "200ms", reconnectInitial: "50ms", positionInterval: "200ms" },
    dispatcher: { pollInterval: "100ms", heartbeatInterval: "200ms", staleAfter: "10s", stopGrace: "1s", headroom: 2, localSlots: 4 },
  };
}

async function startTestFylr(input: FylrConfigInput): Promise<FylrHandle> {
  const fylr = await startFylr(compileFylrConfig(input, "test fylr"));
  return closeLater(track(fylr, `fylr ${fylr.id}`, (f) => f.forceClose().catch(() => undefined)));
}

async function liveJson(fylr: FylrHandle): Promise<FylrPageData> {
  const res = await fetch(`${fylr.url}/status/live.json`);
  expect(res.status).to.equal(200);
  return (await res.json()) as FylrPageData;
}

async function until(page: Page, expression: string, timeout = 8000): Promise<void> {
  await page.waitForFunction(expression, undefined, { timeout });
}

async function attrsOf(locator: Locator, names: readonly string[]): Promise<(string | null)[][]> {
  const out = [];
  for (const el of await locator.all()) out.push(await Promise.all(names.map((n) => el.getAttribute(n))));
  return out;
}

async function attr(page: Page, selector: string, name: string): Promise<string | null> {
  return page.locator(selector).first().getAttribute(name);
}

const sleepCall = (seconds: number) => ({ calls: [{ service: "sleep", args: [String(seconds)] }] });

describe("fylr status page (headless Chromium, real Postgres and execserver)", function () {
  this.timeout(90_000);
  let browser: Browser;
  let databaseUrl: string;
  let db: pg.Pool;

  before(async () => {
    browser = await launchBrowser();
  });
  after(() => release(browser));
  // A fresh database per test: one test's leftover items would be claimed by the next.
  beforeEach(async () => {
    databaseUrl = await createTestDatabase("status_page");
    db = closeLater(track(createPgPool({ connectionString: databaseUrl, max: 2 }), "status page db", (p) => p.end()));
    // The database-outage test terminates sessions, idle ones of this pool too.
    db.on("error", () => undefined);
  });
  afterEach(releaseAll);

  // A statement on the server's "postgres" database (ALTER DATABASE cannot run inside the target).
  async function asAdmin(text: string, params: unknown[] = []): Promise<void> {
    const url = new URL(databaseUrl);
    url.pathname = "/postgres";
    const admin = new pg.Client({ connectionString: url.toString() });
    await admin.connect();
    try {
      await admin.query(text, params);
    } finally {
      await admin.end();
    }
  }

  async function openItems(): Promise<Record<string, Record<string, number>>> {
    const { rows } = await db.query<{ priority: number; state: string; n: number }>(
      "SELECT priority, state, count(*)::int AS n FROM queue_items WHERE state IN ('queued', 'claimed', 'running') GROUP BY priority, state",
    );
    const out: Record<string, Record<string, number>> = {};
    for (const r of rows) (out[String(r.priority)] ??= { queued: 0, claimed: 0, running: 0 })[r.state] = r.n;
    return out;
  }

  it("draws admission, shares, the queue by state and priority, pools and recent items, and follows a second fylr live", async () => {
    const exec: ExecserverHandle = await startTestServer(layout);
    const fylr = await startTestFylr(fylrConfig(databaseUrl, exec.grpcAddress, "page-a"));
    const client: QueueClient = createQueueClient(fylr.url);
    await eventually(() => expect(fylr.dispatcher.stats().execAdmission).to.equal(7), 5000);

    // Two quick items that finish, two sleeps that run, two that wait for a slot, then
    // urgent work beyond the admission of 7: three claimed, three left queued.
    const quick = [];
    for (let i = 0; i < 2; i++) quick.push((await client.submit({ calls: [{ service: "noop" }] })).item!.id);
    await eventually(async () => expect((await liveJson(fylr)).recent.filter((r) => r.state === "succeeded")).to.have.length(2), 8000);
    for (let i = 0; i < 4; i++) await client.submit(sleepCall(60));
    await eventually(async () => expect(await openItems()).to.deep.equal({ "0": { queued: 0, claimed: 2, running: 2 } }), 8000);
    for (let i = 0; i < 6; i++) await client.submit({ ...sleepCall(60), priority: 5 });
    await eventually(
      async () =>
        expect(await openItems()).to.deep.equal({ "0": { queued: 0, claimed: 2, running: 2 }, "5": { queued: 3, claimed: 3, running: 0 } }),
      8000,
    );
    await eventually(() => expect(fylr.dispatcher.stats().execHeld).to.equal(7), 5000);
    const stats = fylr.dispatcher.stats();

    const { page, errors } = await openPage(browser, `${fylr.url}/`);
    // Every viewer shares one snapshot for up to 500 ms: the first one may predate the claims.
    await until(page, `document.querySelector('.boxes[data-name="exec"]')?.getAttribute("data-running") === "7"`);
    expect(await page.title()).to.equal(`fylr ${fylr.id}`);
    expect(await page.locator('[data-name="fylr-id"]').textContent()).to.equal(fylr.id);

    // Admission: one box per admitted item, every one held; local permits as boxes.
    const execBoxes = page.locator('.boxes[data-name="exec"] .box');
    expect(await execBoxes.count()).to.equal(stats.execAdmission);
    expect(await page.locator('.boxes[data-name="exec"] .box[data-state="running"]').count()).to.equal(stats.execHeld);
    expect(await page.locator('.boxes[data-name="local"] .box').count()).to.equal(stats.localCapacity);
    expect(stats.localCapacity).to.equal(4);

    // Shares: ceil(5 slots / 1 client) + headroom 2 for the one instance.
    expect(await attr(page, '.bars[data-name="shares"] .bar-row', "data-key")).to.equal("test-exec");
    expect(await attr(page, '.bars[data-name="shares"] .bar-row', "data-value")).to.equal("7");
    expect(await page.locator('.bars[data-name="shares"] .bar-value').textContent()).to.equal("⌈5 / 1⌉ + 2 = 7");

    // The queue by priority, as Postgres counts it, most urgent on top.
    expect(await attrsOf(page.locator(".queue .rowline"), ["data-priority", "data-queued", "data-claimed", "data-running"])).to.deep.equal([
      ["5", "3", "3", "0"],
      ["0", "0", "2", "2"],
    ]);
    expect(await attrsOf(page.locator('.queue .rowline[data-priority="5"] .seg'), ["data-state", "data-value"])).to.deep.equal([
      ["queued", "3"],
      ["claimed", "3"],
    ]);
    expect(await page.locator('.tile[data-name="queued"] .tile-value').textContent()).to.equal("3");

    // The pool to the execserver: its connection is ready and reached test-exec.
    const pool = page.locator(`.pool[data-address="${exec.grpcAddress}"]`);
    expect(await pool.count()).to.equal(1);
    expect(await pool.locator('.chip[data-state="ready"][data-instance="test-exec"]').count()).to.be.greaterThan(0);

    // This fylr holds 7 items; recent items include the two that succeeded.
    expect(await attr(page, '.bars[data-name="fylrs"] .bar-row', "data-key")).to.equal(fylr.id);
    expect(await attr(page, '.bars[data-name="fylrs"] .bar-row', "data-value")).to.equal("7");
    for (const id of quick) expect(await page.locator(`tr[data-item="${id}"]`).getAttribute("data-state")).to.equal("succeeded");
    expect(await page.locator('table.recent tr[data-state="running"]').count()).to.equal(2);
    await screenshot(page, "fylr");

    // Live: urgent work shows up as a new class; a second fylr halves the share, and the
    // first fylr's seven held items now exceed its admission of ceil(5/2) + 2 = 5.
    await client.submit({ ...sleepCall(60), priority: 9 });
    await until(page, `document.querySelector('.queue .rowline')?.getAttribute("data-priority") === "9"`);
    const second = await startTestFylr(fylrConfig(databaseUrl, exec.grpcAddress, "page-b"));
    await until(page, `document.querySelector('.bars[data-name="shares"] .bar-row')?.getAttribute("data-value") === "5"`);
    await until(page, `document.querySelectorAll('.boxes[data-name="exec"] .box[data-state="over"]').length === 2`);
    await until(page, `document.querySelectorAll('.bars[data-name="fylrs"] .bar-row').length === 2`);
    expect(await page.locator('.bars[data-name="shares"] .bar-value').textContent()).to.equal("⌈5 / 2⌉ + 2 = 5");
    expect(await page.locator(`.bars[data-name="fylrs"] .bar-row[data-key="${second.id}"]`).count()).to.equal(1);
    await screenshot(page, "fylr-live");
    expect(errors).to.deep.equal([]);
  });

  it("keeps drawing the in-memory parts when the database is gone, and says so", async () => {
    const exec = await startTestServer(layout);
    const fylr = await startTestFylr(fylrConfig(databaseUrl, exec.grpcAddress, "page-c"));
    const { page, errors } = await openPage(browser, `${fylr.url}/status`);
    expect(await page.locator('[data-name="database-error"]').count()).to.equal(0);
    expect(await page.locator('[data-section="recent"] .empty').textContent()).to.contain("not claimed anything");
    // Keep new sessions out of the fylr's database and end the ones it has.
    const name = new URL(databaseUrl).pathname.slice(1);
    await asAdmin(`ALTER DATABASE ${name} ALLOW_CONNECTIONS false`);
    try {
      await asAdmin("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1", [name]);
      await until(page, `document.querySelector('[data-name="database-error"]') !== null`);
      expect(await page.locator('.bars[data-name="shares"] .bar-row').count(), "shares are in memory").to.equal(1);
      expect(await page.locator('.pool .chip[data-state="ready"]').count(), "pools are in memory").to.equal(1);
      expect(await page.locator('[data-section="queue"] .empty').textContent()).to.contain("did not answer");
      expect(await page.locator('.tile[data-name="queued"] .tile-value').textContent(), "no made-up zero").to.equal("–");
      await screenshot(page, "fylr-database-down");
    } finally {
      await asAdmin(`ALTER DATABASE ${name} ALLOW_CONNECTIONS true`);
    }
    await until(page, `document.querySelector('[data-name="database-error"]') === null`);
    expect(errors).to.deep.equal([]);
  });

  it("cancels a running and a queued item from their rows' cancel buttons", async () => {
    const exec = await startTestServer(layout);
    const fylr = await startTestFylr(fylrConfig(databaseUrl, exec.grpcAddress, "page-cancel"));
    const client = createQueueClient(fylr.url);
    const running = (await client.submit(sleepCall(60))).item!.id;
    const queued = (await client.submit({ ...sleepCall(60), startAfter: timestampFromDate(new Date(Date.now() + 3_600_000)) })).item!.id;
    await eventually(async () => expect((await client.get({ id: running })).item!.state).to.equal(ItemState.RUNNING), 8000);
    const { page, errors } = await openPage(browser, `${fylr.url}/status`);
    const button = (id: string): string => `tr[data-item="${id}"] button[data-cancel="${id}"]`;
    await until(page, `document.querySelector('${button(running)}') !== null && document.querySelector('${button(queued)}') !== null`);
    expect(await attr(page, `tr[data-item="${running}"]`, "data-state")).to.equal("running");
    expect(await attr(page, `tr[data-item="${queued}"]`, "data-state")).to.equal("queued");
    await screenshot(page, "fylr-cancel-buttons");
    // Hold the queued item's Cancel until a poll has swapped its row (the ages in the rows
    // change every second): the answer must land on the new button, not the replaced one.
    await page.evaluate(`document.querySelector('${button(queued)}').dataset.old = "1"`);
    await page.route("**/slotbroker.v1.QueueService/Cancel", async (route) => {
      await until(page, `document.querySelector('${button(queued)}')?.dataset.old === undefined`).catch(() => undefined);
      await route.continue();
    });
    await page.locator(button(queued)).click();
    await until(page, `document.querySelector('${button(queued)}')?.dataset.old === undefined`);
    expect(await page.locator(button(queued)).textContent(), "the new button still says the call is out").to.equal("cancelling…");
    await until(page, `document.querySelector('${button(queued)}')?.dataset.result === "cancelled" || !document.querySelector('tr[data-item="${queued}"]')`);
    await page.unroute("**/slotbroker.v1.QueueService/Cancel");
    await page.locator(button(running)).click();
    await eventually(async () => expect(ItemState[(await client.get({ id: running })).item!.state]).to.equal("CANCELLED"), 10_000);
    expect(ItemState[(await client.get({ id: queued })).item!.state]).to.equal("CANCELLED");
    // The rows follow, and finished rows have no button. A poll a second; the wait is long
    // because on a loaded CI machine the redraw once took longer than 8 s.
    await until(page, `document.querySelector('tr[data-item="${running}"]')?.dataset.state === "cancelled"`, 20_000);
    expect(await page.locator(button(running)).count()).to.equal(0);
    expect(exec.server.broker.running).to.equal(0);
    await screenshot(page, "fylr-cancelled");
    expect(errors).to.deep.equal([]);
  });

  it("behind API auth: the browser asks for the token (Basic), the page polls with it, and only an admin token cancels", async () => {
    const tokens = { reader: "page-reader-0123456789", ops: "page-ops-0123456789ab" };
    const exec = await startTestServer(layout);
    const fylr = await startTestFylr({
      ...fylrConfig(databaseUrl, exec.grpcAddress, "page-auth"),
      auth: {
        tokens: [
          { name: "reader", token: tokens.reader, scopes: ["read"] },
          { name: "ops", token: tokens.ops, scopes: ["admin"] },
        ],
      },
    });
    const client = createQueueClient(fylr.url, { token: tokens.ops });
    const queued = (await client.submit({ ...sleepCall(60), startAfter: timestampFromDate(new Date(Date.now() + 3_600_000)) })).item!.id;
    const anonymous = await fetch(`${fylr.url}/status`, { headers: { accept: "text/html" } });
    expect(anonymous.status).to.equal(401);
    expect(anonymous.headers.get("www-authenticate")).to.match(/^Basic realm="slotbroker"/);
    const button = `tr[data-item="${queued}"] button[data-cancel="${queued}"]`;

    // A read token shows the page and its live updates; its cancel is refused, and says why.
    const asReader = await openPage(browser, `${fylr.url}/status`, { username: "me", password: tokens.reader });
    await until(asReader.page, `document.querySelector('${button}') !== null`);
    // Submitted after the page loaded: only its poll of /status/view.json can show it.
    const later = (await client.submit({ ...sleepCall(60), startAfter: timestampFromDate(new Date(Date.now() + 3_600_000)) })).item!.id;
    await until(asReader.page, `document.querySelector('tr[data-item="${later}"]') !== null`);
    await asReader.page.locator(button).click();
    await until(asReader.page, `document.querySelector('${button}')?.dataset.result === "error"`);
    expect(await attr(asReader.page, button, "title")).to.equal('token "reader" has read; this call needs the admin scope');
    expect(ItemState[(await client.get({ id: queued })).item!.state]).to.equal("QUEUED");
    expect(asReader.errors.filter((e) => !e.includes("403"))).to.deep.equal([]);

    const asOps = await openPage(browser, `${fylr.url}/status`, { username: "me", password: tokens.ops });
    await until(asOps.page, `document.querySelector('${button}') !== null`);
    await asOps.page.locator(button).click();
    await until(asOps.page, `document.querySelector('${button}')?.dataset.result === "cancelled" || document.querySelector('tr[data-item="${queued}"]')?.dataset.state === "cancelled"`);
    expect(ItemState[(await client.get({ id: queued })).item!.state]).to.equal("CANCELLED");
    expect(asOps.errors).to.deep.equal([]);
  });
});
