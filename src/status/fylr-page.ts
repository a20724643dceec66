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
  });
}

/** The view JSON the page polls for one snapshot. */
export function fylrViewJson(data: FylrPageData, limits: FylrViewLimits = defaultFylrViewLimits): StatusViewJson {
  return statusViewJson(renderFylrSections(fylrView(data, Date.parse(data.at), limits)), new Date(data.at));
}
