/** `slotbroker list [--state S] [--service X]`: items of the queue, newest first. */
import { parseArgs } from "node:util";
import { timestampDate } from "@bufbuild/protobuf/wkt";
import { ItemState, type Item } from "../../gen/slotbroker/v1/queue_pb.js";
import { createQueueClient } from "../api/client.js";
import { apiOptions, apiOptionsHelp, describeApiError, resolveApiConnection, type ApiConnection, type ApiFlags } from "./api-options.js";
import { stateName } from "./submit-progress.js";

const help = `usage: slotbroker list [--state S]… [--service X] [--fairness-key K] [--limit N] [--page TOKEN] [--api URL] [--token-file FILE]

Lists items of the queue, newest first, one page at a time.

  --state S        only items in state S (queued, claimed, running, succeeded, failed,
                   cancelled); repeat for several
  --service X      only items whose first call runs service X (or local action X)
  --min-priority P only items with priority P or more
  --fairness-key K only items of fairness key K ("" for the default key)
  --limit N        items per page (default 50, at most 500)
  --page TOKEN     the page after the one that printed TOKEN
${apiOptionsHelp}
  -h, --help       this text`;

const states: Record<string, ItemState> = {
  queued: ItemState.QUEUED,
  claimed: ItemState.CLAIMED,
  running: ItemState.RUNNING,
  succeeded: ItemState.SUCCEEDED,
  failed: ItemState.FAILED,
  cancelled: ItemState.CANCELLED,
};

/** `slotbroker list`: resolves with the exit code. */
export async function run(argv: string[]): Promise<number> {
  let values: { state?: string[]; service?: string; "fairness-key"?: string; "min-priority"?: string; limit?: string; page?: string; help?: boolean } & ApiFlags;
  try {
    ({ values } = parseArgs({
      args: argv,
      options: {
        state: { type: "string", multiple: true },
        service: { type: "string" },
        "fairness-key": { type: "string" },
        "min-priority": { type: "string" },
        limit: { type: "string" },
        page: { type: "string" },
        ...apiOptions,
        help: { type: "boolean", short: "h" },
      },
    }));
  } catch (err) {
    process.stderr.write(`slotbroker list: ${(err as Error).message}\n\n${help}\n`);
    return 2;
  }
  if (values.help) {
    process.stdout.write(`${help}\n`);
    return 0;
  }
  const wanted: ItemState[] = [];
  for (const s of values.state ?? []) {
    const state = states[s.toLowerCase()];
    if (state === undefined) {
      process.stderr.write(`slotbroker list: --state: "${s}" is not one of ${Object.keys(states).join(", ")}\n`);
      return 2;
    }
    wanted.push(state);
  }
  const number = (flag: string, raw: string | undefined): number | undefined => {
    if (raw === undefined) return undefined;
    const n = Number(raw);
    if (!Number.isInteger(n)) throw new Error(`--${flag}: not a whole number: "${raw}"`);
    return n;
  };
  let target: ApiConnection;
  try {
    target = resolveApiConnection(values);
  } catch (err) {
    process.stderr.write(`slotbroker list: ${(err as Error).message}\n`);
    return 2;
  }
  try {
    const page = await createQueueClient(target.url, target.credentials).list({
      states: wanted,
      service: values.service ?? "",
      fairnessKey: values["fairness-key"],
      minPriority: number("min-priority", values["min-priority"]),
      pageSize: number("limit", values.limit) ?? 0,
      pageToken: values.page ?? "",
    });
    process.stdout.write(formatList(page.items));
    // stdout stays empty for scripts; a person still learns the call worked.
    if (page.items.length === 0) process.stderr.write(`slotbroker list: no items${filtered(values, wanted) ? " match these filters" : " in the queue"}\n`);
    if (page.nextPageToken) process.stderr.write(`more: slotbroker list … --page ${page.nextPageToken}\n`);
    return 0;
  } catch (err) {
    process.stderr.write(`slotbroker list: ${describeApiError(err, target)}\n`);
    return 1;
  }
}

function filtered(values: { service?: string; "fairness-key"?: string; "min-priority"?: string; page?: string }, states: ItemState[]): boolean {
  return states.length > 0 || values.service !== undefined || values["fairness-key"] !== undefined || values["min-priority"] !== undefined || values.page !== undefined;
}

/** The listing as aligned columns (pure; the header only when there are items). */
export function formatList(items: readonly Item[]): string {
  if (items.length === 0) return "";
  const rows = items.map((item) => [
    item.id,
    stateName(item.state) + (item.cancelRequestedAt && item.state === ItemState.RUNNING ? " (cancelling)" : ""),
    String(item.priority),
    item.fairnessKey || "-",
    item.calls.map((c) => c.service).join("|") || item.local?.name || "",
    `${item.attempts}/${item.maxAttempts}`,
    item.createdAt ? timestampDate(item.createdAt).toISOString() : "",
  ]);
  const header = ["ID", "STATE", "PRIO", "KEY", "SERVICE", "ATTEMPTS", "CREATED"];
  const widths = header.map((h, i) => Math.max(h.length, ...rows.map((r) => r[i]!.length)));
  const line = (cells: string[]): string => cells.map((c, i) => (i === cells.length - 1 ? c : c.padEnd(widths[i]!))).join("  ");
  return `${[header, ...rows].map(line).join("\n")}\n`;
}
