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
// the item id to QueueService.Cancel and show what came back until the next poll redraws it.
const cancelScript = `document.addEventListener("click", async (event) => {
  const button = event.target.closest("button[data-cancel]");
  if (!button || button.disabled) return;
  button.disabled = true;
  button.textContent = "cancelling…";
  try {
    const res = await fetch(${JSON.stringify(cancelPath)}, {
      method: "POST", headers: { "Content-Type": "application/json" },
      body: JSON.stringify({ id: button.dataset.cancel }), signal: AbortSignal.timeout(10000),
    });
    const body = await res.json();
    if (!res.ok) throw new Error(body.message || "HTTP " + res.status);
    const state = body.item && body.item.state === "ITEM_STATE_RUNNING" ? "stopping" : "cancelled";
    button.textContent = state;
    button.dataset.result = state;
  } catch (err) {
    button.textContent = "not cancelled";
    button.title = err.message;
    button.dataset.result = "error";
  }
});`;

/** The view JSON the page polls for one snapshot. */
export function fylrViewJson(data: FylrPageData, limits: FylrViewLimits = defaultFylrViewLimits): StatusViewJson {
  return statusViewJson(renderFylrSections(fylrView(data, Date.parse(data.at), limits)), new Date(data.at));
}
