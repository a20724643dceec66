// Live status pages of the execserver and the fylr: pure view models and section renderers,
// the shared page shell (inline CSS and a small polling script). Imports only src/shared and
// gen/; what gathers the data and serves the routes lives with each process's assembly.
export { barList, boxRow, card, legend, maxBoxes, pill, ringGauge, stackedBar, tiles, type BarRow, type BoxGroup, type Segment, type Tile, type Tone } from "./charts.js";
export { execStatusPageRoutes, execViewPath, renderExecStatusPage, type AdminPageRoute, type ExecStatusPageOptions } from "./exec-page.js";
export { execSectionIds, fairnessTone, renderExecSections, type ExecSections } from "./exec-sections.js";
export {
  defaultExecViewLimits,
  execView,
  sumConnections,
  type ConnectionTotals,
  type ConnectionView,
  type ExecView,
  type ExecViewLimits,
  type WaitgroupView,
} from "./exec-view.js";
export type {
  FylrPageData,
  ItemKindJson,
  ItemStateJson,
  PoolConnectionJson,
  PoolJson,
  RecentItemJson,
  ShareJson,
} from "./fylr-page-data.js";
export { fylrViewJson, fylrViewPath, renderFylrStatusPage } from "./fylr-page.js";
export { fylrSectionIds, itemStateTone, renderFylrSections, stateTone, type FylrSections } from "./fylr-sections.js";
export { defaultFylrViewLimits, fylrView, localPermits, priorityRows, type FylrView, type FylrViewLimits, type PriorityRow, type ShareView } from "./fylr-view.js";
export { defaultGrantWindow, GrantWindow, type GrantWindowOptions, type WindowConnection, type WindowFairness } from "./grant-window.js";
export { formatCount, formatDuration, formatPercent, fraction, jainIndex, topN, type TopN } from "./format.js";
export { escapeHtml, html, Html, join, raw, type HtmlValue } from "./html.js";
export { renderItemPage, type ItemPageInput, type ItemPageRow } from "./item-page.js";
export { renderStatusPage, statusViewJson, type StatusPageInput, type StatusViewJson } from "./page.js";
