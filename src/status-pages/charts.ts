/**
 * The pictures both status pages are made of: rows of slot boxes, bar lists, stacked bars,
 * a ring gauge, stat tiles and legends. Pure functions from numbers to markup; every
 * picture carries data-* attributes with its numbers so tests (and curious operators)
 * can read what it shows.
 */
import { formatCount, fraction } from "./format.js";
import { html, join, type Html, type HtmlValue } from "./html.js";

/** A colour role; the page's CSS gives each a colour (running, offered, free, …). */
export type Tone =
  | "running"
  | "offered"
  | "free"
  | "queued"
  | "claimed"
  | "reserved"
  | "over"
  | "legacy"
  | "token"
  | "ok"
  | "warn"
  | "bad"
  | "muted"
  | "accent";

/** One kind of box in a row of boxes. */
export interface BoxGroup {
  readonly tone: Tone;
  readonly count: number;
  /** What one box of this kind means, e.g. "running". */
  readonly label: string;
}

/** Beyond this many boxes a row becomes a proportional bar: a box each would be noise. */
export const maxBoxes = 400;

// Past this many boxes they get smaller, so a row of 100 slots still fits a few lines.
const denseFrom = 48;

/**
 * A row of boxes, one per unit (slot, permit, admitted item), grouped by tone in order.
 * `data-total` is the number of units; each box has `data-state`.
 */
export function boxRow(groups: readonly BoxGroup[], attrs: { readonly name: string }): Html {
  const total = groups.reduce((n, g) => n + Math.max(0, g.count), 0);
  const counts = join(groups.map((g) => html` data-${g.tone}="${g.count}"`));
  if (total > maxBoxes) {
    return html`<div class="boxes as-bar" data-name="${attrs.name}" data-total="${total}"${counts}>${stackedBar(
      groups.map((g) => ({ tone: g.tone, value: g.count, label: g.label })),
    )}</div>`;
  }
  const boxes: Html[] = [];
  let n = 0;
  for (const g of groups) {
    for (let i = 0; i < g.count; i++) {
      n++;
      boxes.push(html`<i class="box t-${g.tone}" data-state="${g.tone}" title="${`${n}: ${g.label}`}"></i>`);
    }
  }
  return html`<div class="boxes${total > denseFrom ? " dense" : ""}" data-name="${attrs.name}" data-total="${total}"${counts}>${boxes}</div>`;
}

/** One row of a bar list. */
export interface BarRow {
  /** Stable key, rendered as data-key (e.g. a client name or a priority). */
  readonly key: string;
  readonly label: HtmlValue;
  /** Small text under the label. */
  readonly detail?: HtmlValue;
  readonly value: number;
  /** The text shown right of the bar (default: the value). */
  readonly display?: HtmlValue;
  readonly tone?: Tone;
  /** A second, thinner value drawn inside the track (e.g. parked wants next to grants). */
  readonly secondary?: { readonly value: number; readonly tone: Tone };
}

/** Horizontal bars sharing one scale (`max`, default the largest value). */
export function barList(rows: readonly BarRow[], options: { readonly max?: number; readonly name: string }): Html {
  const max = options.max ?? rows.reduce((m, r) => Math.max(m, r.value, r.secondary?.value ?? 0), 0);
  const body = rows.map((r) => {
    const width = (100 * fraction(r.value, max)).toFixed(2);
    const second = r.secondary
      ? html`<div class="bar-fill thin t-${r.secondary.tone}" style="width:${(100 * fraction(r.secondary.value, max)).toFixed(2)}%"></div>`
      : "";
    return html`<div class="bar-row" data-key="${r.key}" data-value="${r.value}">
<div class="bar-label"><span class="name">${r.label}</span>${r.detail === undefined ? "" : html`<span class="detail">${r.detail}</span>`}</div>
<div class="bar-track"><div class="bar-fill t-${r.tone ?? "accent"}" style="width:${width}%"></div>${second}</div>
<div class="bar-value">${r.display ?? formatCount(r.value)}</div></div>`;
  });
  return html`<div class="bars" data-name="${options.name}" data-max="${max}">${body}</div>`;
}

/** One segment of a stacked bar. */
export interface Segment {
  readonly tone: Tone;
  readonly value: number;
  readonly label: string;
}

/** A bar split into segments by value, scaled to `max` (default the sum). */
export function stackedBar(segments: readonly Segment[], max?: number): Html {
  const total = segments.reduce((n, s) => n + Math.max(0, s.value), 0);
  const scale = max ?? total;
  const parts = segments
    .filter((s) => s.value > 0)
    .map(
      (s) =>
        html`<div class="seg t-${s.tone}" data-state="${s.tone}" data-value="${s.value}" style="width:${(100 * fraction(s.value, scale)).toFixed(2)}%" title="${`${s.label}: ${formatCount(s.value)}`}"></div>`,
    );
  return html`<div class="stack" data-total="${total}">${parts}</div>`;
}

/** A ring gauge for a value in [0, 1] (undefined draws an empty ring and "–"). */
export function ringGauge(value: number | undefined, options: { readonly name: string; readonly text: string; readonly tone: Tone }): Html {
  const r = 34;
  const c = 2 * Math.PI * r;
  const filled = value === undefined ? 0 : Math.max(0, Math.min(1, value)) * c;
  return html`<svg class="gauge" data-name="${options.name}" data-value="${value === undefined ? "" : value.toFixed(4)}" viewBox="0 0 88 88" width="88" height="88" role="img" aria-label="${`${options.name}: ${options.text}`}">
<circle cx="44" cy="44" r="${r}" class="gauge-track"/>
<circle cx="44" cy="44" r="${r}" class="gauge-fill t-${options.tone}" stroke-dasharray="${`${filled.toFixed(2)} ${c.toFixed(2)}`}" transform="rotate(-90 44 44)"/>
<text x="44" y="50" text-anchor="middle" class="gauge-text">${options.text}</text></svg>`;
}

/** A headline number. */
export interface Tile {
  readonly name: string;
  readonly label: string;
  readonly value: HtmlValue;
  readonly hint?: HtmlValue;
  readonly tone?: Tone;
}

/** A row of headline numbers. */
export function tiles(items: readonly Tile[]): Html {
  return html`<div class="tiles">${items.map(
    (t) =>
      html`<div class="tile${t.tone ? ` tile-${t.tone}` : ""}" data-name="${t.name}"><div class="tile-label">${t.label}</div><div class="tile-value">${t.value}</div>${
        t.hint === undefined ? "" : html`<div class="tile-hint">${t.hint}</div>`
      }</div>`,
  )}</div>`;
}

/** A colour key. */
export function legend(items: readonly { readonly tone: Tone; readonly label: string }[]): Html {
  return html`<div class="legend">${items.map((i) => html`<span><i class="box t-${i.tone}"></i>${i.label}</span>`)}</div>`;
}

/** A pill (state badges in headers and tables). */
export function pill(text: string, tone: Tone): Html {
  return html`<span class="pill t-${tone}">${text}</span>`;
}

/** A section card. */
export function card(title: HtmlValue, body: HtmlValue, options: { readonly note?: HtmlValue; readonly wide?: boolean } = {}): Html {
  return html`<section class="card${options.wide ? " wide" : ""}"><h2>${title}</h2>${
    options.note === undefined ? "" : html`<p class="note">${options.note}</p>`
  }${body}</section>`;
}

/** A muted one-line message for empty sections. */
export function empty(text: HtmlValue): Html {
  return html`<p class="empty">${text}</p>`;
}
