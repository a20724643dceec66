/**
 * The execserver status page on the admin port: the page at "/" and "/status", and the
 * view JSON it polls at "/status/view.json", both from the GetStatus snapshot.
 */
import type { IncomingMessage, ServerResponse } from "node:http";
import type { GetStatusResponse } from "../../gen/slotbroker/v1/broker_pb.js";
import { execSectionIds, renderExecSections } from "./exec-sections.js";
import { defaultExecViewLimits, execView, type ExecViewLimits } from "./exec-view.js";
import { GrantWindow } from "./grant-window.js";
import { renderStatusPage, statusViewJson } from "./page.js";

/** One admin-port route (the shape of AdminServer.route's arguments). */
export interface AdminPageRoute {
  readonly path: string;
  readonly handler: (request: IncomingMessage, response: ServerResponse) => void;
}

/** Options of the execserver page. */
export interface ExecStatusPageOptions {
  readonly limits?: ExecViewLimits;
  /** Clock (ms since epoch) for uptime and connection ages. */
  readonly now?: () => number;
  readonly pollMs?: number;
  /** Grant snapshots kept between renders, for fairness over a recent window. */
  readonly window?: GrantWindow;
}

/** The view JSON path, as linked from the page. */
export const execViewPath = "/status/view.json";

/** Renders the full execserver page for one snapshot. */
export function renderExecStatusPage(status: GetStatusResponse, options: ExecStatusPageOptions = {}): string {
  const sections = renderExecSections(execView(status, (options.now ?? Date.now)(), options.limits ?? defaultExecViewLimits, options.window));
  return renderStatusPage({
    title: `execserver ${status.instanceId}`,
    sections: execSectionIds.map((id) => [id, sections[id]] as const),
    // Relative: resolves to /status/view.json from both "/" and "/status".
    viewUrl: execViewPath.slice(1),
    pollMs: options.pollMs,
  });
}

/** The routes to add to the admin server: the page ("/", "/status") and its view JSON. */
export function execStatusPageRoutes(status: () => GetStatusResponse, options: ExecStatusPageOptions = {}): AdminPageRoute[] {
  const now = options.now ?? Date.now;
  // One window per execserver: every viewer's polls feed the same snapshots.
  const window = new GrantWindow();
  const page = (_req: IncomingMessage, res: ServerResponse): void => {
    const body = renderExecStatusPage(status(), { ...options, window });
    res.writeHead(200, { "content-type": "text/html; charset=utf-8", "cache-control": "no-store" }).end(body);
  };
  const view = (_req: IncomingMessage, res: ServerResponse): void => {
    const at = now();
    const json = statusViewJson(renderExecSections(execView(status(), at, options.limits ?? defaultExecViewLimits, window)), new Date(at));
    res.writeHead(200, { "content-type": "application/json", "cache-control": "no-store" }).end(JSON.stringify(json));
  };
  return [
    { path: "/", handler: page },
    { path: "/status", handler: page },
    { path: execViewPath, handler: view },
  ];
}
