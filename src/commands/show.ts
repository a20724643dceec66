/**
 * `slotbroker show ID…`: an item and its timeline (QueueService Get and History) through
 * any fylr of the queue: each step with its time, the time since the step before, the
 * fylr, execserver and attempt, so "where did the time go" is one command.
 */
import { parseArgs } from "node:util";
import { timestampDate } from "@bufbuild/protobuf/wkt";
import type { HistoryResponse, Item } from "../../gen/slotbroker/v1/queue_pb.js";
import { createQueueClient } from "../api/client.js";
import { formatStep, timelineText } from "../api/timeline.js";
import { apiOptions, apiOptionsHelp, describeApiError, resolveApiConnection, type ApiConnection, type ApiFlags } from "./api-options.js";
import { stateName } from "./submit-progress.js";

const help = `usage: slotbroker show ID… [--api URL] [--token-file FILE]

Prints an item and its timeline: submitted, each claim (by which fylr, which attempt),
each call's wait for a slot and its job on an execserver (exit code, runtime), requeues
(after a failed attempt, no slot in time, or rescued from a fylr that died), cancels and
retries, and how it ended, with the time since the step before. An item keeps its latest
200 events.

${apiOptionsHelp}
  -h, --help         this text

The token needs the read scope.`;

/** `slotbroker show ID…`: resolves with the exit code (1 when any item could not be shown). */
export async function run(argv: string[]): Promise<number> {
  let values: { help?: boolean } & ApiFlags;
  let positionals: string[];
  try {
    ({ values, positionals } = parseArgs({ args: argv, options: { ...apiOptions, help: { type: "boolean", short: "h" } }, allowPositionals: true }));
  } catch (err) {
    process.stderr.write(`slotbroker show: ${(err as Error).message}\n\n${help}\n`);
    return 2;
  }
  if (values.help) {
    process.stdout.write(`${help}\n`);
    return 0;
  }
  if (positionals.length === 0) {
    process.stderr.write(`slotbroker show: give one or more item ids\n\n${help}\n`);
    return 2;
  }
  let target: ApiConnection;
  try {
    target = resolveApiConnection(values);
  } catch (err) {
    process.stderr.write(`slotbroker show: ${(err as Error).message}\n`);
    return 2;
  }
  const client = createQueueClient(target.url, target.credentials);
  let failures = 0;
  for (const [i, id] of positionals.entries()) {
    try {
      const [{ item }, history] = await Promise.all([client.get({ id }), client.history({ id })]);
      process.stdout.write(`${i > 0 ? "\n" : ""}${showText(item!, history).join("\n")}\n`);
    } catch (err) {
      failures++;
      process.stderr.write(`slotbroker show: ${id}: ${describeApiError(err, target)}\n`);
    }
  }
  return failures > 0 ? 1 : 0;
}

/** The lines `show` prints for one item: a header, then the timeline. */
export function showText(item: Item, history: HistoryResponse): string[] {
  const what = item.calls.length > 0 ? item.calls.map((c) => c.service).join(" → ") : `local ${item.local?.name ?? "?"}`;
  const created = item.createdAt && timestampDate(item.createdAt);
  const finished = item.finishedAt && timestampDate(item.finishedAt);
  const took = created && finished ? ` after ${formatStep(finished.getTime() - created.getTime())}` : "";
  const header = [
    `item ${item.id}: ${what}, priority ${item.priority}`,
    `state ${stateName(item.state)}${took}, attempts ${item.attempts} of ${item.maxAttempts}${item.claimedBy ? `, held by ${item.claimedBy}` : ""}`,
  ];
  if (item.error) header.push(`error: ${item.error}`);
  return [...header, "", ...timelineText(history)];
}
