/**
 * The fylr status page's item view: one item and its timeline (History) as a
 * self-contained HTML document — inline CSS, no script, no external assets; every value
 * escaped. Pure: the route gathers the item and its rows.
 */
import { card, pill } from "./charts.js";
import { itemStateTone } from "./fylr-sections.js";
import { html, raw } from "./html.js";
import { pageStyle } from "./page-style.js";

/** One step as the page shows it. */
export interface ItemPageRow {
  readonly number: number;
  /** ISO 8601; undefined when unknown. */
  readonly at: string | undefined;
  /** "+1.25s"; empty for the first. */
  readonly since: string;
  readonly what: string;
}

/** What the item view shows. */
export interface ItemPageInput {
  readonly id: string;
  /** Lower-case state name. */
  readonly state: string;
  /** The calls' services ("a → b") or "local NAME". */
  readonly what: string;
  readonly priority: number;
  readonly attempts: number;
  readonly maxAttempts: number;
  readonly claimedBy: string | undefined;
  /** "3.30s" from submit to the end, once finished. */
  readonly took: string | undefined;
  readonly error: string | undefined;
  readonly rows: readonly ItemPageRow[];
  /** Earlier events no longer kept. */
  readonly dropped: number;
}

/** Renders the whole HTML document of one item. */
export function renderItemPage(input: ItemPageInput): string {
  const facts = html`<p>${pill(input.state, itemStateTone(input.state))} ${input.what}, priority ${input.priority}, attempts ${input.attempts} of ${
    input.maxAttempts
  }${input.took ? html`, ${input.took} from submit to end` : ""}${input.claimedBy ? html`, held by <code>${input.claimedBy}</code>` : ""}</p>${
    input.error ? html`<p class="detail">${input.error}</p>` : ""
  }`;
  const rows = input.rows.map(
    (r) => html`<tr><td class="num">${r.number}</td><td><time datetime="${r.at ?? ""}">${r.at ? r.at.slice(11, 23) : "?"}</time></td><td class="num">${r.since}</td><td>${r.what}</td></tr>`,
  );
  const note = input.dropped > 0 ? `${input.dropped} earlier events are no longer kept (an item keeps its latest 200).` : "Times are UTC; a call's start and end are its fylr's clock.";
  const timeline = card(
    "Timeline",
    html`<table><thead><tr><th class="num">#</th><th>time (UTC)</th><th class="num">+since</th><th>event</th></tr></thead><tbody>${rows}</tbody></table>`,
    { note, wide: true },
  );
  const page = html`<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width,initial-scale=1">
<meta name="color-scheme" content="light dark"><link rel="icon" href="data:,"><title>${`item ${input.id}`}</title><style>${raw(pageStyle)}</style></head>
<body><main>
<header><h1>item <code>${input.id}</code></h1><p><a href="../../status">back to the status page</a></p></header>
${card("Item", facts, { wide: true })}
${timeline}
</main></body></html>
`;
  return page.value;
}
