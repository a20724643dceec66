/**
 * The fylr status page, drawn from one FylrPageData snapshot: the page served at "/" and
 * "/status", and the view JSON it polls at "/status/view.json". Pure: the fylr's assembly
 * gathers the snapshot and serves the routes.
 */
import type { FylrPageData } from "./fylr-page-data.js";
import { fylrSectionIds, renderFylrSections } from "./fylr-sections.js";
import { defaultFylrViewLimits, fylrView, type FylrViewLimits } from "./fylr-view.js";
import { renderStatusPage, statusViewJson, type StatusViewJson } from "./page.js";

/** The view JSON path, as linked from the page. */
export const fylrViewPath = "/status/view.json";

/** Renders the full fylr page for one snapshot. */
export function renderFylrStatusPage(data: FylrPageData, options: { now?: number; limits?: FylrViewLimits; pollMs?: number } = {}): string {
  const sections = renderFylrSections(fylrView(data, options.now ?? Date.parse(data.at), options.limits ?? defaultFylrViewLimits));
  return renderStatusPage({
    title: `fylr ${data.fylrId}`,
    sections: fylrSectionIds.map((id) => [id, sections[id]] as const),
    viewUrl: fylrViewPath.slice(1),
    pollMs: options.pollMs,
    script: cancelScript,
  });
}

/** QueueService.Cancel as JSON over HTTP, relative to the page (it works behind a path prefix). */
export const cancelPath = "slotbroker.v1.QueueService/Cancel";

// One listener for every cancel button, present and future (the poll swaps rows in): POST
// the item id to QueueService.Cancel and show what came back. What each cancel showed is
// kept by item id and put back on the new buttons after every swap, so a poll that lands
// while the call is out (or just after) neither loses the answer nor re-enables the button.
const cancelScript = `(() => {
  const shown = new Map();
  function show(id) {
    const s = shown.get(id);
    for (const b of document.querySelectorAll('button[data-cancel="' + CSS.escape(id) + '"]')) {
      b.disabled = true;
      b.textContent = s.text;
      if (s.result) b.dataset.result = s.result;
      if (s.title) b.title = s.title;
    }
  }
  document.addEventListener("status:swapped", () => { for (const id of shown.keys()) show(id); });
  document.addEventListener("click", async (event) => {
    const button = event.target.closest("button[data-cancel]");
    if (!button || button.disabled) return;
    const id = button.dataset.cancel;
    shown.set(id, { text: "cancelling…" });
    show(id);
    try {
      const res = await fetch(${JSON.stringify(cancelPath)}, {
        method: "POST", headers: { "Content-Type": "application/json" },
        body: JSON.stringify({ id }), signal: AbortSignal.timeout(10000),
      });
      const body = await res.json();
      if (!res.ok) throw new Error(body.message || "HTTP " + res.status);
      const state = body.item && body.item.state === "ITEM_STATE_RUNNING" ? "stopping" : "cancelled";
      shown.set(id, { text: state, result: state });
    } catch (err) {
      shown.set(id, { text: "not cancelled", result: "error", title: err.message });
    }
    show(id);
  });
})();`;

/** The view JSON the page polls for one snapshot. */
export function fylrViewJson(data: FylrPageData, limits: FylrViewLimits = defaultFylrViewLimits): StatusViewJson {
  return statusViewJson(renderFylrSections(fylrView(data, Date.parse(data.at), limits)), new Date(data.at));
}
