import { expect } from "chai";
import type { Browser, Page } from "playwright-core";
import type { GetStatusResponse } from "../gen/slotbroker/v1/broker_pb.js";
import { jainIndex } from "../src/status/index.js";
import { BrokerStream, releaseAll } from "./execserver/support/broker-stream.js";
import { startTestServer } from "./execserver/support/server.js";
import { release } from "./support/resources.js";
import { launchBrowser, openPage, screenshot } from "./status-page-browser.js";

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

async function barRows(page: Page, selector: string): Promise<{ key: string; value: number; width: number }[]> {
  const out = [];
  for (const row of await page.locator(`${selector} .bar-row`).all()) {
    const box = await row.locator(".bar-fill").first().boundingBox();
    out.push({ key: (await row.getAttribute("data-key")) ?? "", value: Number(await row.getAttribute("data-value")), width: box?.width ?? -1 });
  }
  return out;
}

/** Waits (bounded) until a page expression is true; the expression is a string: tests have no DOM types. */
async function until(page: Page, expression: string, timeout = 5000): Promise<void> {
  await page.waitForFunction(expression, undefined, { timeout });
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
    await until(page, `document.querySelector('.bars[data-name="grants"] .bar-row')?.getAttribute("data-key") === "delta"`);
    const after = await barRows(page, '.bars[data-name="grants"]');
    expect(after[0]).to.include({ key: "delta", value: 7 });
    await until(page, `document.querySelectorAll('[data-waitgroup="slow"] .box[data-state="running"]').length === 3`);
    expect(await slotBoxes(page, "slow")).to.deep.equal({ total: 3, running: 3, offered: 0, free: 0 });
    expect(Number(await page.locator("#live").getAttribute("data-polls"))).to.be.greaterThan(polls);
    expect(await page.locator("#live").getAttribute("class")).to.equal("live ok");
    await screenshot(page, "execserver-live");
    expect(errors).to.deep.equal([]);
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
});
