import { create } from "@bufbuild/protobuf";
import { expect } from "chai";
import { ConnectionStatusSchema, GetStatusResponseSchema, LegacyStatusSchema, type GetStatusResponse } from "../gen/slotbroker/v1/broker_pb.js";
import { durationFromMs, timestampFromDate } from "@bufbuild/protobuf/wkt";
import { execserverSection } from "../src/commands/status-tables.js";
import { pageStyle } from "../src/status-pages/page-style.js";
import {
  boxRow,
  escapeHtml,
  execView,
  formatCount,
  formatDuration,
  formatPercent,
  fylrView,
  html,
  jainIndex,
  localPermits,
  maxBoxes,
  priorityRows,
  raw,
  renderExecSections,
  renderExecStatusPage,
  renderFylrSections,
  renderFylrStatusPage,
  renderItemPage,
  tiles,
  topN,
  type Tone,
  type FylrPageData,
} from "../src/status-pages/index.js";

const now = Date.parse("2026-01-01T12:00:00Z");
const hostile = `<script>alert("x")</script>&'`;

function execStatus(connections: number, patch: { draining?: boolean } = {}): GetStatusResponse {
  return create(GetStatusResponseSchema, {
    instanceId: "exec-1",
    startedAt: timestampFromDate(new Date(now - 65_000)),
    services: { ffmpeg: "video", convert: "images", identify: "images" },
    waitgroups: [
      { name: "video", processes: 4, running: 2, offered: 1, free: 1, waiting: 7n, book: [{ priority: 0, wants: 5n, keys: 3 }, { priority: 10, wants: 2n, keys: 1 }], completed: 9n, meanRuntime: durationFromMs(1500) },
      { name: "images", processes: 2, running: 0, offered: 0, free: 2, waiting: 0n, book: [], completed: 0n },
    ],
    connections: Array.from({ length: connections }, (_, i) =>
      create(ConnectionStatusSchema, {
        connectionId: `c${i}`,
        clientName: i === 0 ? hostile : `fylr-${i}`,
        peerAddress: `10.0.0.${i % 250}:5000`,
        connectedAt: timestampFromDate(new Date(now - 1000 * i)),
        wantsParked: BigInt(i % 3),
        offers: BigInt(i),
        grants: BigInt(i),
        running: i % 2,
      }),
    ),
    ...patch,
  });
}

function fylrData(patch: Partial<FylrPageData> = {}): FylrPageData {
  return {
    at: new Date(now).toISOString(),
    fylrId: "fylr-a",
    startedAt: new Date(now - 5000).toISOString(),
    dispatcher: { state: "running", execHeld: 9, execAdmission: 7, headroom: 2, localRunning: 3, localCapacity: 8, localReservedForHigh: 2, counters: { claimed: 12, requeued: 1 } },
    shares: [{ instanceId: hostile, address: "127.0.0.1:7600", capacity: 10, clients: 2, share: 7 }],
    instances: [{ instanceId: hostile, address: "127.0.0.1:7600", processes: 10, clients: 2, draining: false }],
    pools: [
      {
        address: "127.0.0.1:7600",
        covered: true,
        opened: 2,
        grown: 1,
        duplicatesClosed: 1,
        connections: [{ name: "127.0.0.1:7600#1", state: "ready", instanceId: hostile, rttMs: 0.4, parked: 3, running: 6 }],
      },
    ],
    wants: { parked: 3, running: 6 },
    queue: [
      { kind: "exec", state: "queued", priority: 0, count: 40 },
      { kind: "exec", state: "claimed", priority: 0, count: 3 },
      { kind: "local", state: "running", priority: 0, count: 3 },
      { kind: "exec", state: "queued", priority: 5, count: 2 },
      { kind: "exec", state: "running", priority: 5, count: 6 },
    ],
    fylrs: [
      { id: "fylr-b", hostname: "b", held: 4, heartbeatAgeMs: 300 },
      { id: "fylr-a", hostname: "a", held: 9, heartbeatAgeMs: 100 },
    ],
    recent: [],
    databaseError: undefined,
    ...patch,
  };
}

describe("status page renderers", () => {
  describe("html", () => {
    it("escapes every interpolated string, nested ones too, and keeps Html as it is", () => {
      const out = html`<p title="${hostile}">${[hostile, raw("<b>ok</b>"), null, false, 3]}</p>`.value;
      expect(out).to.equal(
        `<p title="&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;&amp;&#39;">&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;&amp;&#39;<b>ok</b>3</p>`,
      );
      expect(escapeHtml("`a`")).to.equal("&#96;a&#96;");
    });
  });

  describe("format", () => {
    it("computes Jain's index: 1 for equal shares, 1/n when one takes all, nothing for no data", () => {
      expect(jainIndex([4, 4, 4, 4])).to.equal(1);
      expect(jainIndex([10, 0, 0, 0])).to.equal(0.25);
      expect(jainIndex([5, 2, 0])).to.be.closeTo(49 / 87, 1e-12);
      expect(jainIndex([])).to.equal(undefined);
      expect(jainIndex([0, 0])).to.equal(undefined);
    });

    it("formats counts, durations and percentages for people", () => {
      expect(formatCount(1234567)).to.equal("1,234,567");
      expect(formatCount(-1000)).to.equal("-1,000");
      expect([850, 4200, 65_000, 5 * 3600_000 + 120_000, 3 * 86400_000 + 4 * 3600_000].map(formatDuration)).to.deep.equal(["850 ms", "4.2 s", "1 m 5 s", "5 h 02 m", "3 d 4 h"]);
      expect(formatDuration(-1)).to.equal("–");
      expect([formatPercent(1, 30), formatPercent(27, 100), formatPercent(1, 0)]).to.deep.equal(["3.3 %", "27 %", "0 %"]);
    });

    it("keeps the top n and says how many are left", () => {
      const t = topN([3, 1, 4, 1, 5], 2, (a, b) => b - a);
      expect(t).to.deep.equal({ shown: [5, 4], more: 3, rest: [3, 1, 1] });
    });
  });

  describe("charts", () => {
    it("draws one box per unit, in group order", () => {
      const row = boxRow(
        [
          { tone: "running", count: 2, label: "running" },
          { tone: "free", count: 1, label: "free" },
        ],
        { name: "x" },
      ).value;
      expect(row.match(/class="box /g)).to.have.length(3);
      expect(row.indexOf('data-state="running"')).to.be.below(row.indexOf('data-state="free"'));
      expect(row).to.contain('data-total="3" data-running="2" data-free="1"');
    });

    it("turns a row of more than maxBoxes units into one proportional bar", () => {
      const row = boxRow([{ tone: "running", count: maxBoxes + 1, label: "running" }], { name: "big" }).value;
      expect(row).to.not.contain('class="box ');
      expect(row).to.contain("as-bar").and.to.contain(`data-total="${maxBoxes + 1}"`);
    });

    it("gives every tone class a tile or a box can carry a colour in the stylesheet", () => {
      const all: Tone[] = ["running", "offered", "free", "queued", "claimed", "reserved", "over", "legacy", "token", "ok", "warn", "bad", "muted", "accent"];
      const markup = tiles(all.map((tone) => ({ name: tone, label: tone, value: 1, tone }))).value;
      const used = [...markup.matchAll(/class="tile ([\w-]+)"/g)].map((m) => m[1]!);
      expect(used).to.have.length(all.length);
      for (const cls of [...used, ...all.map((tone) => `t-${tone}`)]) expect(pageStyle, cls).to.match(new RegExp(`\\.${cls}[,{]`));
    });
  });

  describe("execserver view", () => {
    it("sums the waitgroups, sorts the book most urgent first and lists the services of each waitgroup", () => {
      const v = execView(execStatus(3), now);
      expect(v.totals).to.deep.equal({ processes: 6, running: 2, offered: 1, free: 3, waiting: 7 });
      expect(v.waitgroups[0]!.book).to.deep.equal([
        { priority: 10, wants: 2, keys: 1 },
        { priority: 0, wants: 5, keys: 3 },
      ]);
      expect(v.waitgroups[1]!.services).to.deep.equal(["convert", "identify"]);
      expect(v.uptimeMs).to.equal(65_000);
      expect(v.waitgroups[0]!.meanRuntimeMs).to.equal(1500);
    });

    it("measures fairness only over connections that asked for something", () => {
      // c0 asked for nothing (no wants, offers or grants): it does not count as starved.
      const v = execView(execStatus(4), now);
      expect(v.fairness.over).to.equal(3);
      expect(v.fairness.index).to.be.closeTo(jainIndex([1, 2, 3])!, 1e-12);
    });

    it("keeps 1000 connections to 20 bars and 25 rows, summing the rest", () => {
      const v = execView(execStatus(1000), now);
      expect(v.grants.shown.map((c) => c.grants).slice(0, 3)).to.deep.equal([999, 998, 997]);
      expect([v.grants.shown.length, v.grants.more, v.connections.shown.length, v.connections.more]).to.deep.equal([20, 980, 25, 975]);
      const all = v.connections.shown.reduce((n, c) => n + c.grants, 0) + v.restTotals.grants;
      expect(all).to.equal((999 * 1000) / 2);
      const sections = renderExecSections(v);
      expect(sections.grants.value.match(/class="bar-row"/g)).to.have.length(20);
      expect(sections.grants.value).to.contain("and 980 more connection(s)");
      expect(sections.connections.value.match(/<tr data-connection=/g)).to.have.length(25);
    });

    it("renders client names as text", () => {
      const page = renderExecStatusPage(execStatus(2), { now: () => now });
      expect(page).to.not.contain("<script>alert");
      expect(page).to.contain("&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;");
    });

    it("shows per priority how many fairness keys the parked wants are under", () => {
      const book = renderExecSections(execView(execStatus(0), now)).book.value;
      expect(book).to.match(/data-key="10" data-value="2">\s*<div class="bar-label"><span class="name">priority 10<\/span><span class="detail">1 key<\/span>/);
      expect(book).to.match(/data-key="0" data-value="5">\s*<div class="bar-label"><span class="name">priority 0<\/span><span class="detail">3 keys<\/span>/);
      expect(execserverSection("127.0.0.1:1", execStatus(0))).to.match(/BOOK +PRIORITY +WANTS +KEYS\nvideo +0 +5 +3\nvideo +10 +2 +1/);
    });

    it("draws one slot box per process with the state counts of GetStatus", () => {
      const slots = renderExecSections(execView(execStatus(0), now)).slots.value;
      expect(slots).to.contain('data-name="video" data-total="4" data-running="2" data-offered="1" data-free="1"');
      expect(slots.match(/<i class="box t-\w+" data-state=/g)).to.have.length(6);
    });

    it("draws legacy jobs and tokens in their own boxes and counts the token protocol apart, only when it is on", () => {
      const status = execStatus(0);
      expect(renderExecSections(execView(status, now)).legacy.value).to.equal("");
      status.waitgroups[0]!.legacyRunning = 1;
      status.waitgroups[0]!.legacyTokens = 1;
      status.legacy = create(LegacyStatusSchema, { tokensOutstanding: 1, jobsRunning: 1, jobsDone: 3n, tokensIssued: 5n, tokensNotFound: 2n, refusedWantsParked: 4n });
      const sections = renderExecSections(execView(status, now));
      expect(sections.slots.value).to.contain('data-name="video" data-total="4" data-running="1" data-legacy="1" data-offered="0" data-token="1" data-free="1"');
      expect(sections.slots.value).to.contain("held by a legacy token");
      expect(sections.legacy.value).to.contain('data-name="legacy-not-found"');
      expect(sections.legacy.value).to.match(/Token not found<\/div><div class="tile-value">2</);
      expect(sections.legacy.value).to.contain("4 because broker wants were parked");
    });

    it("shows draining in the header", () => {
      const header = renderExecSections(execView(execStatus(0, { draining: true }), now)).header.value;
      expect(header).to.contain('data-name="draining"').and.to.contain(">draining<");
    });
  });

  describe("fylr view", () => {
    it("folds open items into rows per priority, most urgent first", () => {
      expect(priorityRows(fylrData().queue)).to.deep.equal([
        { priority: 5, queued: 2, claimed: 0, running: 6, exec: 8, local: 0, total: 8 },
        { priority: 0, queued: 40, claimed: 3, running: 3, exec: 43, local: 3, total: 46 },
      ]);
    });

    it("splits local permits into used, free and free-but-reserved", () => {
      expect(localPermits(8, 3, 2)).to.deep.equal({ capacity: 8, running: 3, free: 3, reservedFree: 2, reserved: 2 });
      expect(localPermits(8, 7, 2)).to.deep.equal({ capacity: 8, running: 7, free: 0, reservedFree: 1, reserved: 2 });
    });

    it("marks items held beyond the admission and puts this fylr first", () => {
      const v = fylrView(fylrData(), now);
      expect(v.exec).to.deep.equal({ held: 9, admission: 7, within: 7, free: 0, over: 2 });
      expect(v.fylrs.shown.map((f) => [f.id, f.self])).to.deep.equal([
        ["fylr-a", true],
        ["fylr-b", false],
      ]);
      const s = renderFylrSections(v);
      expect(s.admission.value).to.contain('data-name="exec" data-total="9" data-running="7" data-free="0" data-over="2"');
      expect(s.shares.value).to.contain("⌈10 / 2⌉ + 2 =");
    });

    it("shows open items per fairness key, keys escaped, the default key named", () => {
      const keys = { top: [{ key: "<b>tenant</b>", queued: 40, held: 2 }, { key: "", queued: 1, held: 3 }], queuedKeys: 2 };
      const s = renderFylrSections(fylrView(fylrData({ keys }), now));
      expect(s.keys.value).to.contain("&lt;b&gt;tenant&lt;/b&gt;").and.contain("default key").and.contain("40 queued · 2 held");
      expect(s.keys.value).to.not.contain("<b>tenant");
      expect(renderFylrSections(fylrView(fylrData(), now)).keys.value).to.contain("No open items");
    });

    it("escapes instance ids from the network and shows a database outage instead of zeros", () => {
      const page = renderFylrStatusPage(fylrData({ queue: [], fylrs: [], databaseError: `down <now>` }));
      expect(page).to.not.contain("<script>alert");
      expect(page).to.contain("Database unavailable: down &lt;now&gt;");
      const s = renderFylrSections(fylrView(fylrData({ queue: [], databaseError: "down" }), now));
      expect(s.summary.value).to.match(/data-name="queued">.*<div class="tile-value">–</);
    });
  });

  describe("page", () => {
    it("is self-contained: no external scripts, styles or images", () => {
      const page = renderExecStatusPage(execStatus(3), { now: () => now });
      expect(page).to.not.match(/\b(src|href)="(https?:)?\/\//);
      expect(page).to.not.match(/@import|url\(/);
      expect(page).to.contain('<link rel="icon" href="data:,">');
      expect(page).to.contain('data-src="status/view.json"');
      for (const id of ["header", "summary", "slots", "book", "grants", "connections"]) expect(page).to.contain(`id="s-${id}" data-section="${id}"`);
    });
  });
});

describe("the item view", () => {
  const hostile = `<script>alert("x")</script>`;
  const input = {
    id: "2b0c0e4a-7a0e-4f5e-9a55-1b8f3f2f6a11",
    state: "failed",
    what: "sha256sum",
    priority: 0,
    attempts: 2,
    maxAttempts: 2,
    claimedBy: undefined,
    took: "8.40s",
    error: hostile,
    dropped: 0,
    rows: [
      { number: 1, at: "2026-01-01T12:00:00.000Z", since: "", what: "submitted" },
      { number: 2, at: "2026-01-01T12:00:00.012Z", since: "+12ms", what: `failed by f-1 (attempt 2): ${hostile}` },
    ],
  };

  it("is one self-contained document: no script, no external asset, every value escaped", () => {
    const page = renderItemPage(input);
    expect(page).to.not.include("<script");
    expect(page).to.not.match(/\b(?:src|href)="(?:https?:)?\/\//);
    expect(page).to.include(escapeHtml(hostile));
    expect(page).to.include("<td>submitted</td>");
    expect(page).to.include(`<td class="num">+12ms</td>`);
    expect(page).to.include("8.40s from submit to end");
  });

  it("says how many earlier events are no longer kept", () => {
    expect(renderItemPage({ ...input, dropped: 41 })).to.include("41 earlier events are no longer kept");
  });
});
