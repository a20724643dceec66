/**
 * The fylr status page on the fylr's HTTP port: the page at "/" and "/status", the view
 * JSON it polls at "/status/view.json", and the snapshot it is drawn from at
 * "/status/live.json" (for operators and scripts).
 */
import type { RawRoute } from "../fylr/index.js";
import { defaultFylrViewLimits, fylrViewJson, renderFylrStatusPage, fylrViewPath, type FylrViewLimits } from "../status-pages/index.js";
import { FylrStatusSource, type FylrStatusSourceOptions } from "./fylr-status-source.js";

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

/** Creates the source and the routes ("/", "/status", "/status/view.json", "/status/live.json"). */
export function createFylrStatusPage(options: FylrStatusPageOptions): FylrStatusPage {
  const source = new FylrStatusSource(options);
  const limits = options.limits ?? defaultFylrViewLimits;
  const headers = (type: string): Record<string, string> => ({ "content-type": type, "cache-control": "no-store" });
  const page: RawRoute["handle"] = async ({ res }) => {
    const body = renderFylrStatusPage(await source.snapshot(), { limits, pollMs: options.pollMs });
    res.writeHead(200, headers("text/html; charset=utf-8")).end(body);
  };
  // The page shows items: it needs the read scope (a browser sends a token as Basic auth).
  const routes: RawRoute[] = [
    { path: "/", methods: ["GET"], scope: "read", handle: page },
    { path: "/status", methods: ["GET"], scope: "read", handle: page },
    {
      path: fylrViewPath,
      methods: ["GET"],
      scope: "read",
      handle: async ({ res }) => {
        res.writeHead(200, headers("application/json")).end(JSON.stringify(fylrViewJson(await source.snapshot(), limits)));
      },
    },
    {
      path: "/status/live.json",
      methods: ["GET"],
      scope: "read",
      handle: async ({ res }) => {
        res.writeHead(200, headers("application/json")).end(JSON.stringify(await source.snapshot()));
      },
    },
  ];
  return { routes, source, close: () => source.close() };
}
