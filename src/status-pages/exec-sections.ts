/**
 * The execserver status page's sections, rendered from its view model: header, headline
 * tiles, slot boxes per waitgroup, the want-book by priority, grants per connection with
 * their fairness, and the busiest connections. Pure.
 */
import { barList, boxRow, card, empty, legend, pill, ringGauge, tiles, type BarRow, type Tone } from "./charts.js";
import type { ConnectionView, ExecView, WaitgroupView } from "./exec-view.js";
import { formatCount, formatDuration, formatPercent } from "./format.js";
import { html, type Html } from "./html.js";

/** The ids of the execserver page's sections, in page order. */
export const execSectionIds = ["header", "summary", "slots", "book", "legacy", "grants", "connections"] as const;

/** Rendered sections by id. */
export type ExecSections = Record<(typeof execSectionIds)[number], Html>;

/** Renders every section of the execserver page. */
export function renderExecSections(view: ExecView): ExecSections {
  return {
    header: header(view),
    summary: summary(view),
    slots: slots(view),
    book: book(view),
    legacy: legacy(view),
    grants: grants(view),
    connections: connections(view),
  };
}

/** The fairness tone: green from 0.9, amber from 0.6, red below. */
export function fairnessTone(index: number | undefined): Tone {
  if (index === undefined) return "muted";
  if (index >= 0.9) return "ok";
  return index >= 0.6 ? "warn" : "bad";
}

function header(view: ExecView): Html {
  const state = view.draining ? pill("draining", "warn") : pill("serving", "ok");
  const banner = view.draining
    ? html`<div class="banner t-warn" data-name="draining">Draining: no new offers; running jobs finish within the grace period.</div>`
    : "";
  return html`<header class="top"><div><h1>execserver <code data-name="instance-id">${view.instanceId}</code></h1>
<div class="sub">${state} <span data-name="uptime">up ${view.uptimeMs === undefined ? "–" : formatDuration(view.uptimeMs)}</span></div></div></header>${banner}`;
}

// "in the last 42 s", or, before the page has a snapshot old enough, since each connection opened.
function windowText(view: ExecView): string {
  const span = view.fairness.spanMs;
  return span === undefined ? "since each connection opened" : `in the last ${formatDuration(span)}`;
}

function summary(view: ExecView): Html {
  const t = view.totals;
  const busy = t.running + t.offered;
  const index = view.fairness.index;
  const l = view.legacy;
  const hint = l
    ? `${t.running - l.jobsRunning} running · ${t.offered - l.tokensOutstanding} offered · ${l.jobsRunning + l.tokensOutstanding} legacy`
    : `${t.running} running · ${t.offered} offered`;
  return tiles([
    { name: "slots", label: "Slots in use", value: html`${formatCount(busy)}<small> / ${formatCount(t.processes)}</small>`, hint },
    { name: "waiting", label: "Wants parked", value: formatCount(t.waiting), tone: t.waiting > 0 ? "queued" : undefined },
    { name: "connections", label: "Connections", value: formatCount(view.connectionCount) },
    { name: "grants", label: "Grants", value: formatCount(view.totalGrants), hint: "jobs started since start-up" },
    {
      name: "fairness",
      label: "Fairness (Jain)",
      value: index === undefined ? "–" : index.toFixed(2),
      hint: `${windowText(view)} · ${view.fairness.over} asking connection(s)`,
      tone: fairnessTone(index),
    },
  ]);
}

function waitgroupRow(wg: WaitgroupView, withLegacy: boolean): Html {
  const stat = (key: string, label: string, value: string): Html => html`<span data-k="${key}">${label} <b>${value}</b></span>`;
  return html`<div class="wg" data-waitgroup="${wg.name}">
<div class="wg-head"><span class="wg-name">${wg.name}</span><span class="detail">${wg.processes} slot(s)${
    wg.services.length > 0 ? ` · ${wg.services.join(", ")}` : ""
  }</span></div>
${boxRow(
  withLegacy
    ? [
        { tone: "running", count: wg.running - wg.legacyRunning, label: "running a broker job" },
        { tone: "legacy", count: wg.legacyRunning, label: "running a legacy (token) job" },
        { tone: "offered", count: wg.offered - wg.legacyTokens, label: "offered, waiting for JOB" },
        { tone: "token", count: wg.legacyTokens, label: "held by a legacy token, waiting for PUT /job" },
        { tone: "free", count: wg.free, label: "free" },
      ]
    : [
        { tone: "running", count: wg.running, label: "running a job" },
        { tone: "offered", count: wg.offered, label: "offered, waiting for JOB" },
        { tone: "free", count: wg.free, label: "free" },
      ],
  { name: wg.name },
)}
<div class="wg-stats">${stat("running", "running", String(wg.running))}${stat("offered", "offered", String(wg.offered))}${stat("free", "free", String(wg.free))}${stat(
    "waiting",
    "waiting",
    formatCount(wg.waiting),
  )}${withLegacy ? html`${stat("legacy-running", "legacy jobs", String(wg.legacyRunning))}${stat("legacy-tokens", "legacy tokens", String(wg.legacyTokens))}` : ""}${stat(
    "completed",
    "done",
    formatCount(wg.completed),
  )}${stat("mean", "mean run", wg.meanRuntimeMs === undefined ? "–" : formatDuration(wg.meanRuntimeMs))}</div></div>`;
}

function slots(view: ExecView): Html {
  const body =
    view.waitgroups.length === 0
      ? empty("no waitgroups configured")
      : html`${legend([
          { tone: "running", label: "running" },
          { tone: "offered", label: "offered" },
          ...(view.legacy
            ? [
                { tone: "legacy" as const, label: "legacy job" },
                { tone: "token" as const, label: "legacy token" },
              ]
            : []),
          { tone: "free", label: "free" },
        ])}${view.waitgroups.map((wg) => waitgroupRow(wg, view.legacy !== undefined))}`;
  return card("Slots per waitgroup", body, { note: "One box per slot. An offered slot is held for one want until its JOB or DECLINE.", wide: true });
}

function book(view: ExecView): Html {
  const groups = view.waitgroups.filter((wg) => wg.waiting > 0);
  const max = groups.reduce((m, wg) => wg.book.reduce((mm, d) => Math.max(mm, d.wants), m), 0);
  const body =
    groups.length === 0
      ? empty("The book is empty: every want was served at once.")
      : groups.map(
          (wg) =>
            html`<div class="book" data-waitgroup="${wg.name}"><h3>${wg.name} <span class="detail">${formatCount(wg.waiting)} parked</span></h3>${barList(
              wg.book.map((d) => ({ key: String(d.priority), label: `priority ${d.priority}`, detail: keysText(d.keys), value: d.wants, tone: "queued" })),
              { name: `book-${wg.name}`, max },
            )}</div>`,
        );
  return card("Want-book by priority", body, {
    note: "Parked wants per priority class, most urgent on top; the top class is served first. Within a class, each connection's wants are served key by key.",
  });
}

// An execserver older than fairness keys reports 0 keys: say nothing then.
function keysText(keys: number): string | undefined {
  if (keys === 0) return undefined;
  return keys === 1 ? "1 key" : `${formatCount(keys)} keys`;
}

// Only when the token protocol is on: an empty section otherwise, so the page is unchanged.
function legacy(view: ExecView): Html {
  const l = view.legacy;
  if (!l) return html``;
  const body = tiles([
    { name: "legacy-tokens", label: "Tokens held", value: formatCount(l.tokensOutstanding), hint: `${formatCount(l.expired)} expired unredeemed`, tone: l.tokensOutstanding > 0 ? "legacy" : undefined },
    { name: "legacy-running", label: "Legacy jobs", value: formatCount(l.jobsRunning), hint: `${formatCount(l.jobsDone)} done`, tone: l.jobsRunning > 0 ? "legacy" : undefined },
    { name: "legacy-issued", label: "Tokens issued", value: formatCount(l.issued), hint: `${formatCount(l.redeemed)} redeemed · ${formatCount(l.released)} released` },
    {
      name: "legacy-refused",
      label: "GET /token refused",
      value: formatCount(l.refusedNoSlot + l.refusedWantsParked),
      hint: `${formatCount(l.refusedWantsParked)} because broker wants were parked`,
    },
    { name: "legacy-not-found", label: "Token not found", value: formatCount(l.notFound), hint: "PUTs that reached the wrong instance, or came too late", tone: l.notFound > 0 ? "warn" : undefined },
  ]);
  return card("Legacy token protocol", body, { note: "Old fylrs polling GET /token and PUT /job. Their slots are in the boxes above, in their own colours.", wide: true });
}

function connectionLabel(c: ConnectionView): Html {
  return c.client === "" ? html`<span class="muted">(unnamed)</span>` : html`${c.client}`;
}

function grants(view: ExecView): Html {
  const { index, over } = view.fairness;
  const { windowMs, minSpanMs } = view.fairnessWindow;
  const gauge = ringGauge(index, { name: "jain", text: index === undefined ? "–" : index.toFixed(2), tone: fairnessTone(index) });
  const explain = html`<div class="fair"><div>${gauge}</div><p><b>Jain index ${index === undefined ? "–" : index.toFixed(3)}</b> over the grants per second, ${windowText(view)},
of ${over} connection(s) that asked for slots in that time (a connection younger than ${formatDuration(minSpanMs)} counts as that old).
1.00 means every connection was granted at the same rate; 1/n means one took everything. The window is the last ${formatDuration(windowMs)}
while this page is open; the bars below count grants since each connection opened.</p></div>`;
  const rows: BarRow[] = view.grants.shown.map((c) => ({
    key: c.client,
    label: connectionLabel(c),
    detail: `${c.peer}${c.parked > 0 ? ` · ${formatCount(c.parked)} parked` : ""}`,
    value: c.grants,
    display: html`${formatCount(c.grants)} <small>${formatPercent(c.grants, view.totalGrants)}</small>`,
    tone: "running",
  }));
  const restGrants = view.grants.rest.reduce((n, c) => n + c.grants, 0);
  const more =
    view.grants.more > 0
      ? html`<p class="more" data-name="grants-more" data-more="${view.grants.more}">and ${formatCount(view.grants.more)} more connection(s) with ${formatCount(restGrants)} grant(s)</p>`
      : "";
  const body = view.connectionCount === 0 ? empty("no broker streams connected") : html`${explain}${barList(rows, { name: "grants" })}${more}`;
  return card("Grants per connection", body, { note: "Jobs started per broker stream, most first." });
}

const columns: readonly { key: keyof ConnectionView; label: string }[] = [
  { key: "parked", label: "parked" },
  { key: "offers", label: "offers" },
  { key: "grants", label: "grants" },
  { key: "declines", label: "declines" },
  { key: "expired", label: "expired" },
  { key: "rejects", label: "rejects" },
  { key: "running", label: "running" },
  { key: "done", label: "done" },
];

function connections(view: ExecView): Html {
  if (view.connectionCount === 0) return card("Connections", empty("no broker streams connected"), { wide: true });
  const cell = (value: number): Html => html`<td class="num${value === 0 ? " zero" : ""}">${formatCount(value)}</td>`;
  const rows = view.connections.shown.map(
    (c) =>
      html`<tr data-connection="${c.id}" data-client="${c.client}"><td>${connectionLabel(c)}</td><td class="detail">${c.peer}</td><td class="num">${
        c.ageMs === undefined ? "–" : formatDuration(c.ageMs)
      }</td>${columns.map((col) => cell(c[col.key] as number))}</tr>`,
  );
  const rest = view.restTotals;
  const more =
    view.connections.more > 0
      ? html`<tr class="more-row" data-name="connections-more" data-more="${view.connections.more}"><td colspan="3">and ${formatCount(view.connections.more)} more</td>${columns.map(
          (col) => cell(rest[col.key as keyof typeof rest]),
        )}</tr>`
      : "";
  const table = html`<div class="table-wrap"><table class="conns"><thead><tr><th>client</th><th>peer</th><th class="num">connected</th>${columns.map(
    (col) => html`<th class="num">${col.label}</th>`,
  )}</tr></thead><tbody>${rows}${more}</tbody></table></div>`;
  return card(`Connections (${formatCount(view.connectionCount)})`, table, { note: "Busiest first: parked wants and running jobs, then grants.", wide: true });
}
