/**
 * The fylr status page on the fylr's HTTP port: the page at "/" and "/status", the view
 * JSON it polls at "/status/view.json", the snapshot it is drawn from at
 * "/status/live.json" (for operators and scripts), and one item with its timeline at
 * "/status/items/ID".
 */
import { timestampDate } from "@bufbuild/protobuf/wkt";
import { formatSince, formatStep, timelineRows } from "../api/index.js";
import { historyToProto, itemToProto, type Dispatcher } from "../dispatcher/index.js";
import { httpStatusFor, sendText, type RawRoute } from "../fylr/index.js";
import { Code, SlotbrokerError } from "../shared/errors.js";
import { defaultFylrViewLimits, fylrViewJson, renderFylrStatusPage, renderItemPage, fylrViewPath, type FylrViewLimits, type ItemPageInput } from "../status-pages/index.js";
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

/** Creates the source and the routes ("/", "/status", "/status/view.json", "/status/live.json", "/status/items/:id"). */
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
    {
      path: "/status/items/:id",
      methods: ["GET"],
      scope: "read",
      handle: async ({ res, params }) => {
        try {
          const body = renderItemPage(await itemPageInput(options.dispatcher, params.id!));
          res.writeHead(200, headers("text/html; charset=utf-8")).end(body);
        } catch (err) {
          // Unknown (404) or malformed (400) ids, an unreachable database (503): said in plain text.
          sendText(res, httpStatusFor(err), (err as Error).message);
        }
      },
    },
  ];
  return { routes, source, close: () => source.close() };
}

// The item and its timeline, as QueueService's Get and History answer them.
async function itemPageInput(dispatcher: Dispatcher, id: string): Promise<ItemPageInput> {
  const history = historyToProto(await dispatcher.history(id));
  const item = await dispatcher.get(id);
  if (!item) throw new SlotbrokerError(Code.NotFound, `item ${id} not found`);
  const proto = itemToProto(item);
  const finished = proto.finishedAt && timestampDate(proto.finishedAt);
  return {
    id: item.id,
    state: item.state,
    what: item.kind === "exec" ? item.calls.map((c) => c.service).join(" → ") : `local ${item.local?.name ?? "?"}`,
    priority: item.priority,
    attempts: item.attempts,
    maxAttempts: item.maxAttempts,
    claimedBy: proto.claimedBy || undefined,
    took: finished && formatStep(finished.getTime() - item.createdAt.getTime()),
    error: item.error,
    dropped: history.eventsDropped,
    rows: timelineRows(history).map((r) => ({
      number: r.number,
      at: r.at?.toISOString(),
      since: formatSince(r.sincePreviousMs),
      what: r.what,
    })),
  };
}
