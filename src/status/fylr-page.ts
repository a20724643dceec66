/**
 * The fylr status page on the fylr's HTTP port: the page at "/" and "/status", the view
 * JSON it polls at "/status/view.json", and the snapshot it is drawn from at
 * "/status/live.json" (for operators and scripts).
 */
import type { RawRoute } from "../fylr/index.js";
import { FylrStatusSource, type FylrPageData, type FylrStatusSourceOptions } from "./fylr-data.js";
import { fylrSectionIds, renderFylrSections } from "./fylr-sections.js";
import { defaultFylrViewLimits, fylrView, type FylrViewLimits } from "./fylr-view.js";
import { renderStatusPage, statusViewJson } from "./page.js";

/** Options of the fylr page. */
export interface FylrStatusPageOptions extends FylrStatusSourceOptions {
  readonly limits?: FylrViewLimits;
  readonly pollMs?: number;
}

/** The fylr page's routes and the source behind them; close() when the fylr stops. */
export interface FylrStatusPage {
  readonly routes: readonly RawRoute[];
  readonly source: FylrStatusSource;
  close(): void;
}

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

/** Creates the source and the routes ("/", "/status", "/status/view.json", "/status/live.json"). */
export function createFylrStatusPage(options: FylrStatusPageOptions): FylrStatusPage {
  const source = new FylrStatusSource(options);
  const limits = options.limits ?? defaultFylrViewLimits;
  const page: RawRoute["handle"] = async ({ res }) => {
    const body = renderFylrStatusPage(await source.snapshot(), { limits, pollMs: options.pollMs });
    res.writeHead(200, { "content-type": "text/html; charset=utf-8", "cache-control": "no-store" }).end(body);
  };
  const json = (body: unknown): string => JSON.stringify(body);
  const routes: RawRoute[] = [
    { path: "/", methods: ["GET"], handle: page },
    { path: "/status", methods: ["GET"], handle: page },
    {
      path: fylrViewPath,
      methods: ["GET"],
      handle: async ({ res }) => {
        const data = await source.snapshot();
        const view = statusViewJson(renderFylrSections(fylrView(data, Date.parse(data.at), limits)), new Date(data.at));
        res.writeHead(200, { "content-type": "application/json", "cache-control": "no-store" }).end(json(view));
      },
    },
    {
      path: "/status/live.json",
      methods: ["GET"],
      handle: async ({ res }) => {
        res.writeHead(200, { "content-type": "application/json", "cache-control": "no-store" }).end(json(await source.snapshot()));
      },
    },
  ];
  return { routes, source, close: () => source.close() };
}
