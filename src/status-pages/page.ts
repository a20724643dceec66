/**
 * The page shell both status pages share: one self-contained HTML document (inline CSS, a
 * few lines of inline script, no external assets) with the first rendering inside, and the
 * JSON the script polls to swap sections in place. All markup is rendered on the server by
 * the pure section renderers; the script only moves escaped fragments into the page.
 */
import { html, raw, type Html } from "./html.js";
import { pageStyle } from "./page-style.js";

/** What the page script polls: the sections, rendered. */
export interface StatusViewJson {
  /** When the snapshot was taken (ISO 8601). */
  readonly at: string;
  /** Section id → markup. */
  readonly sections: Readonly<Record<string, string>>;
}

/** Everything a status page is made of. */
export interface StatusPageInput {
  /** The document title. */
  readonly title: string;
  /** Sections in page order; the first two (header, summary) span the page, the rest flow in a grid. */
  readonly sections: readonly (readonly [id: string, markup: Html])[];
  /** The view JSON, relative to the page (so the page works behind a path prefix). */
  readonly viewUrl: string;
  /** Poll interval (default 1000 ms). */
  readonly pollMs?: number;
  /** A page's own script, after the shared poll script (a constant, never user data). */
  readonly script?: string;
}

/** The view JSON for a set of rendered sections. */
export function statusViewJson(sections: Readonly<Record<string, Html>>, at: Date): StatusViewJson {
  const out: Record<string, string> = {};
  for (const [id, markup] of Object.entries(sections)) out[id] = markup.value;
  return { at: at.toISOString(), sections: out };
}

// Polls the view JSON and swaps every section whose markup changed, then says so with a
// "status:swapped" event. The markup was escaped on the server; the script itself only
// ever writes textContent of its own.
const pollScript = `(() => {
  const live = document.getElementById("live"), label = live.querySelector("span");
  const url = live.dataset.src, every = Number(live.dataset.every);
  let last = Date.now(), polls = 0;
  const seen = new Map();
  async function tick() {
    try {
      const res = await fetch(url, { cache: "no-store", signal: AbortSignal.timeout(5000) });
      if (!res.ok) throw new Error("HTTP " + res.status);
      const view = await res.json();
      let swapped = false;
      for (const [id, markup] of Object.entries(view.sections)) {
        const el = document.getElementById("s-" + id);
        if (el && seen.get(id) !== markup) { el.innerHTML = markup; seen.set(id, markup); swapped = true; }
      }
      if (swapped) document.dispatchEvent(new Event("status:swapped"));
      last = Date.now();
      live.dataset.polls = String(++polls);
      live.className = "live ok";
      label.textContent = "live · " + new Date(view.at).toLocaleTimeString();
    } catch (err) {
      live.className = "live stale";
      label.textContent = "no answer for " + Math.round((Date.now() - last) / 1000) + " s (" + err.message + ")";
    }
    setTimeout(tick, every);
  }
  setTimeout(tick, every);
})();`;

/** Renders the whole HTML document. */
export function renderStatusPage(input: StatusPageInput): string {
  const head = input.sections.slice(0, 2);
  const rest = input.sections.slice(2);
  const wrap = ([id, markup]: readonly [string, Html]): Html => html`<div id="${`s-${id}`}" data-section="${id}">${markup}</div>`;
  const page = html`<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width,initial-scale=1">
<meta name="color-scheme" content="light dark"><link rel="icon" href="data:,"><title>${input.title}</title><style>${raw(pageStyle)}</style></head>
<body><main>
<div class="live" id="live" data-src="${input.viewUrl}" data-every="${input.pollMs ?? 1000}" data-polls="0"><i></i><span>${`snapshot · polling every ${((input.pollMs ?? 1000) / 1000).toString()} s`}</span></div>
<noscript><p class="banner t-warn">JavaScript is off: this page shows one snapshot; reload to refresh it.</p></noscript>
${head.map(wrap)}
<div class="grid">${rest.map(wrap)}</div>
</main><script>${raw(pollScript)}</script>${input.script ? html`<script>${raw(input.script)}</script>` : ""}</body></html>
`;
  return page.value;
}
