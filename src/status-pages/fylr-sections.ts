/**
 * The fylr status page's sections, rendered from its view model: header, headline tiles,
 * admission (exec items held against the sum of shares, local permits), shares per
 * instance, the open queue by priority, the fylrs sharing the queue, the broker pools and
 * the items this fylr claimed last. Pure.
 */
import { barList, boxRow, card, empty, legend, pill, stackedBar, tiles, type BarRow, type Tone } from "./charts.js";
import { formatCount, formatDuration } from "./format.js";
import type { PoolConnectionJson, PoolJson } from "./fylr-page-data.js";
import type { FylrView } from "./fylr-view.js";
import { html, type Html } from "./html.js";

/** The ids of the fylr page's sections, in page order. */
export const fylrSectionIds = ["header", "summary", "admission", "shares", "queue", "keys", "fylrs", "pools", "recent"] as const;

/** Rendered sections by id. */
export type FylrSections = Record<(typeof fylrSectionIds)[number], Html>;

/** Renders every section of the fylr page. */
export function renderFylrSections(view: FylrView): FylrSections {
  return {
    header: header(view),
    summary: summary(view),
    admission: admission(view),
    shares: shares(view),
    queue: queue(view),
    keys: keys(view),
    fylrs: fylrs(view),
    pools: pools(view),
    recent: recent(view),
  };
}

const stateTones: Record<string, Tone> = {
  running: "ok",
  ready: "ok",
  succeeded: "ok",
  queued: "queued",
  claimed: "claimed",
  connecting: "warn",
  backoff: "warn",
  stopping: "warn",
  idle: "muted",
  unknown: "muted",
  failed: "bad",
  cancelled: "muted",
  closed: "bad",
  stopped: "bad",
};

/** The tone of a dispatcher or connection state. */
export function stateTone(state: string): Tone {
  return stateTones[state] ?? "muted";
}

/** The tone of a queue item's state: the same colours as the queue chart. */
export function itemStateTone(state: string): Tone {
  return state === "running" ? "running" : stateTone(state);
}

function header(view: FylrView): Html {
  const banner = view.databaseError
    ? html`<div class="banner t-bad" data-name="database-error">Database unavailable: ${view.databaseError}. Queue figures are missing; the rest is live.</div>`
    : "";
  return html`<header class="top"><div><h1>fylr <code data-name="fylr-id">${view.fylrId}</code></h1>
<div class="sub">${pill(view.state, stateTone(view.state))} <span data-name="uptime">up ${formatDuration(view.uptimeMs)}</span>
<span>${formatCount(view.wants.parked)} want(s) parked · ${formatCount(view.wants.running)} job(s) running</span></div></div></header>${banner}`;
}

function summary(view: FylrView): Html {
  const c = view.counters;
  const n = (key: string): number => c[key] ?? 0;
  return tiles([
    {
      name: "exec",
      label: "Exec items held",
      value: html`${formatCount(view.exec.held)}<small> / ${formatCount(view.exec.admission)}</small>`,
      hint: "held / admission (Σ shares)",
      tone: view.exec.over > 0 ? "over" : "running",
    },
    { name: "local", label: "Local permits", value: html`${formatCount(view.local.running)}<small> / ${formatCount(view.local.capacity)}</small>`, hint: "in use / all" },
    view.databaseError
      ? { name: "queued", label: "Queued", value: "–", hint: "database unavailable", tone: "bad" }
      : {
          name: "queued",
          label: "Queued",
          value: formatCount(view.queueTotals.queued),
          hint: `${formatCount(view.queueTotals.claimed + view.queueTotals.running)} held by fylrs`,
          tone: "queued",
        },
    { name: "claimed", label: "Claimed", value: formatCount(n("claimed")), hint: `${formatCount(n("succeeded"))} ok · ${formatCount(n("failed"))} failed` },
    {
      name: "requeued",
      label: "Requeued",
      value: formatCount(n("requeued")),
      hint: `${formatCount(n("orphansRescued"))} orphan(s) rescued · ${formatCount(n("fenced"))} fenced`,
    },
  ]);
}

function admission(view: FylrView): Html {
  const e = view.exec;
  const l = view.local;
  const execRow = boxRow(
    [
      { tone: "running", count: e.within, label: "held (claimed or running)" },
      { tone: "free", count: e.free, label: "may still be claimed" },
      { tone: "over", count: e.over, label: "held beyond the admission (capacity went away)" },
    ],
    { name: "exec" },
  );
  const localRow = boxRow(
    [
      { tone: "running", count: l.running, label: "running a local action" },
      { tone: "free", count: l.free, label: "free" },
      { tone: "reserved", count: l.reservedFree, label: "free, reserved for high priority" },
    ],
    { name: "local" },
  );
  return card(
    "Admission",
    html`<h3>Exec items <span class="detail">${formatCount(e.held)} held of ${formatCount(e.admission)} admitted</span></h3>${
      e.admission === 0 && e.held === 0 ? empty("No execserver capacity in sight: nothing exec-bound is claimed.") : execRow
    }<h3>Local permits <span class="detail">${formatCount(l.running)} of ${formatCount(l.capacity)} in use, ${formatCount(l.reserved)} kept for high priority</span></h3>${localRow}${legend([
      { tone: "running", label: "in use" },
      { tone: "free", label: "free" },
      { tone: "reserved", label: "reserved for high priority" },
      { tone: "over", label: "over admission" },
    ])}`,
    { note: "One box per item this fylr may hold: it claims exec work only up to the sum of its shares." },
  );
}

function shares(view: FylrView): Html {
  if (view.shares.length === 0) return card("Shares per instance", empty("No execserver instance connected."));
  const rows = view.shares.map((s): BarRow => ({
    key: s.instanceId,
    label: s.instanceId,
    detail: s.draining ? `${s.address} · draining` : s.address,
    value: s.share,
    display: s.draining ? "0" : html`<small>⌈${s.capacity} / ${s.clients}⌉ + ${s.headroom} =</small> ${s.share}`,
    tone: (s.draining ? "muted" : "claimed"),
  }));
  return card("Shares per instance", barList(rows, { name: "shares" }), {
    note: "This fylr's claim share of each execserver: ⌈slots / connected clients⌉ + headroom.",
  });
}

function queue(view: FylrView): Html {
  const t = view.queueTotals;
  if (view.databaseError) return card("Queue by priority", empty("The database did not answer."));
  if (t.queued + t.claimed + t.running === 0) return card("Queue by priority", empty("No open items: the queue is empty."));
  const max = view.priorities.shown.reduce((m, r) => Math.max(m, r.total), 0);
  const rows = view.priorities.shown.map(
    (r) =>
      html`<div class="rowline" data-priority="${r.priority}" data-queued="${r.queued}" data-claimed="${r.claimed}" data-running="${r.running}"><span class="label">priority ${r.priority}</span>${stackedBar(
        [
          { tone: "queued", value: r.queued, label: "queued" },
          { tone: "claimed", value: r.claimed, label: "claimed" },
          { tone: "running", value: r.running, label: "running" },
        ],
        max,
      )}<span class="count">${formatCount(r.total)}</span></div>`,
  );
  const rest = view.priorities.rest.reduce((n, r) => n + r.total, 0);
  const more = view.priorities.more > 0 ? html`<p class="more">and ${view.priorities.more} lower priority class(es) with ${formatCount(rest)} item(s)</p>` : "";
  return card(
    "Queue by priority",
    html`${legend([
      { tone: "queued", label: `queued ${formatCount(t.queued)}` },
      { tone: "claimed", label: `claimed ${formatCount(t.claimed)}` },
      { tone: "running", label: `running ${formatCount(t.running)}` },
    ])}<div class="queue" data-queued="${t.queued}" data-claimed="${t.claimed}" data-running="${t.running}">${rows}</div>${more}`,
    { note: `Open items of every fylr, most urgent first (exec ${formatCount(t.exec)} · local ${formatCount(t.local)}).` },
  );
}

function keys(view: FylrView): Html {
  if (view.keys.top.length === 0) return card("Fairness keys", empty(view.databaseError ? "The database did not answer." : "No open items."));
  const rows = view.keys.top.map((k): BarRow => ({
    key: k.key,
    label: k.key === "" ? "default key" : k.key,
    detail: `${formatCount(k.queued)} queued · ${formatCount(k.held)} held`,
    value: k.queued + k.held,
    tone: "queued",
    secondary: { value: k.held, tone: "running" },
  }));
  return card("Fairness keys", barList(rows, { name: "keys" }), {
    note: `Open items per key of every fylr, most queued first; ${formatCount(view.keys.queuedKeys)} key(s) have queued items. Within a priority, claims take keys in turn.`,
  });
}

function fylrs(view: FylrView): Html {
  if (view.fylrs.shown.length === 0) return card("Fylrs on this queue", empty(view.databaseError ? "The database did not answer." : "No live fylrs."));
  const rows = view.fylrs.shown.map((f): BarRow => ({
    key: f.id,
    label: f.id,
    detail: `${f.self ? "this fylr · " : ""}${f.hostname} · heartbeat ${formatDuration(f.heartbeatAgeMs)} ago`,
    value: f.held,
    tone: (f.self ? "running" : "accent"),
  }));
  const more = view.fylrs.more > 0 ? html`<p class="more">and ${formatCount(view.fylrs.more)} more fylr(s)</p>` : "";
  return card("Fylrs on this queue", html`${barList(rows, { name: "fylrs" })}${more}`, { note: "Items each live fylr holds (claimed or running)." });
}

function connectionChip(c: PoolConnectionJson): Html {
  const rtt = c.rttMs === undefined ? "" : ` · rtt ${c.rttMs < 10 ? c.rttMs.toFixed(1) : Math.round(c.rttMs)} ms`;
  return html`<div class="chip t-${stateTone(c.state)}" data-connection="${c.name}" data-state="${c.state}" data-instance="${c.instanceId ?? ""}"><b>${c.name}</b>${pill(
    c.state,
    stateTone(c.state),
  )} ${c.instanceId === undefined ? html`<span class="muted">no HELLO yet</span>` : html`→ <code>${c.instanceId}</code>`}<div class="muted">${formatCount(c.parked)} parked · ${formatCount(
    c.running,
  )} running${rtt}</div></div>`;
}

function pool(p: PoolJson, limit: number): Html {
  const shown = p.connections.slice(0, limit);
  const more = p.connections.length - shown.length;
  const instances = new Set(p.connections.map((c) => c.instanceId).filter((i) => i !== undefined)).size;
  return html`<div class="pool" data-address="${p.address}" data-covered="${String(p.covered)}" data-connections="${p.connections.length}">
<div class="wg-head"><span class="wg-name">${p.address}</span>${p.covered ? pill("covered", "accent") : pill("may grow", "muted")}<span class="detail">${
    p.connections.length
  } connection(s) to ${instances} instance(s) · opened ${p.opened} · grown ${p.grown} · duplicates closed ${p.duplicatesClosed}</span></div>
<div class="chips">${shown.map(connectionChip)}</div>${more > 0 ? html`<p class="more">and ${more} more connection(s)</p>` : ""}</div>`;
}

function pools(view: FylrView): Html {
  const body = view.pools.length === 0 ? empty("No execserver addresses configured.") : view.pools.map((p) => pool(p, view.connectionChips));
  return card("Broker pools", body, {
    note: "Connections per configured address. “covered”: a new connection reached an instance already in the pool, so growth pauses until the next re-probe.",
    wide: true,
  });
}

function recent(view: FylrView): Html {
  if (view.recent.length === 0) return card("Recent items", empty("This fylr has not claimed anything yet."), { wide: true });
  const rows = view.recent.map(
    (r) =>
      html`<tr data-item="${r.id}" data-state="${r.state}"><td><a href="${`status/items/${r.id}`}" title="${`${r.id}: its timeline`}"><code>${r.id.slice(0, 8)}</code></a></td><td>${r.kind}</td><td class="num">${r.priority}</td><td>${r.fairnessKey === undefined ? "–" : r.fairnessKey || "default"}</td><td>${pill(
        r.state,
        itemStateTone(r.state),
      )}</td><td>${r.phase ?? "–"}</td><td>${r.service ?? "–"}</td><td>${r.instanceId ?? "–"}</td><td class="num">${r.attempts}</td><td class="num">${
        r.ageMs === undefined ? "–" : `${formatDuration(r.ageMs)} ago`
      }</td><td class="detail" title="${r.error ?? ""}">${r.error ?? ""}</td><td>${cancelButton(r.id, r.state)}</td></tr>`,
  );
  return card(
    "Recent items",
    html`<div class="table-wrap"><table class="recent"><thead><tr><th>item</th><th>kind</th><th class="num">priority</th><th>key</th><th>state</th><th>phase here</th><th>service</th><th>instance</th><th class="num">attempts</th><th class="num">updated</th><th>error</th><th></th></tr></thead><tbody>${rows}</tbody></table></div>`,
    {
      note: "The items this fylr claimed last, newest first, and the newest items waiting in the queue: their state in the database and their phase here. Cancel stops an item on whichever fylr holds it.",
      wide: true,
    },
  );
}

// Only items that can still be stopped get a button.
function cancelButton(id: string, state: string): Html | string {
  if (state !== "queued" && state !== "claimed" && state !== "running") return "";
  return html`<button type="button" class="cancel" data-cancel="${id}" title="${`cancel item ${id}`}">cancel</button>`;
}
