import { toJson } from "@bufbuild/protobuf";
import { Code, ConnectError } from "@connectrpc/connect";
import { ItemSchema, ItemState, type Item, type SubmitRequest, type WatchResponse } from "../../gen/slotbroker/v1/queue_pb.js";
import { createQueueClient, followItem } from "../api/client.js";
import { downloadOutput } from "../api/store-client.js";
import { apiOptionsHelp, describeApiError, resolveApiConnection, type ApiConnection } from "./api-options.js";
import { parseSubmitArgs, withStdin, type SubmitPlan } from "./submit-args.js";
import { prepareInput, type PreparedInput } from "./submit-input.js";
import { progressLine, receiptLines, stateName } from "./submit-progress.js";

const help = `usage: slotbroker submit --service SERVICE [call options] [--then SERVICE [call options]]...
                         [item options] [--wait]
       slotbroker submit --local ACTION [--param K=V]... [--stdin FILE] [item options] [--wait]

Submits one item to the queue through a fylr's QueueService and prints its id on stdout.
With --wait it follows the item (state and queue position on stderr) and then prints the
item's output bytes on stdout and the receipts on stderr; the exit code is 1 when the item
failed.

calls (flags apply to the call they follow):
  --service SERVICE    the first call (a service of the execservers, e.g. sha256sum)
  --arg X              an argument for the call (repeat; --arg=-n for one starting with -)
  --env NAME=VALUE     an environment variable the service allows (repeat)
  --timeout DUR        the call's timeout, e.g. 30s (default: the service's)
  --stdin FILE         the first call's stdin from FILE ("-" reads standard input); any
                       size: past 1 MiB it is streamed to the fylr's store first
  --stdin-url URL      the first call's stdin fetched by the fylr from URL
  --then SERVICE       one more call whose stdin is the previous call's stdout (repeat)

local actions (run inside the fylr, e.g. checksum, count):
  --local ACTION       the action; its input is --stdin FILE
  --param NAME=VALUE   an action parameter, e.g. algorithm=sha1 (repeat)

item:
  --priority N         larger is more urgent (default 0)
  --idempotency-key K  a repeated submit with K returns the first item
  --start-after WHEN   not before WHEN: a duration from now (5m) or an ISO time
  --max-attempts N     attempts before the item fails (default: the fylr's, 3)
  --fairness-key K     who the item is for (a tenant, a user): within a priority, keys
                       take turns at claim (--key is the client's TLS key)
  --weight W           the key's weight in that turn, 1…1000 (default 1)
  --key-limit N        at most N items of the key held at once across the fleet

output:
  -w, --wait           follow the item to its end and print its output (streamed, any
                       size; checked against the item's SHA-256)
  --json               print the item as JSON instead of its id / its output
  -h, --help           this text

the fylr:
${apiOptionsHelp}

examples:
  slotbroker submit --service sha256sum --stdin photo.jpg --wait
  slotbroker submit --service cat --stdin log.txt --then gzip --then base64 --wait
  slotbroker submit --service sleep --arg 30 --priority 5
  slotbroker submit --local checksum --param algorithm=md5 --stdin photo.jpg --wait`;

/** `slotbroker submit …`: resolves with the exit code. */
export async function run(argv: string[]): Promise<number> {
  let plan: SubmitPlan;
  try {
    plan = parseSubmitArgs(argv);
  } catch (err) {
    process.stderr.write(`slotbroker submit: ${(err as Error).message}\n\n(slotbroker submit --help for the options)\n`);
    return 2;
  }
  if (plan.help) {
    process.stdout.write(`${help}\n`);
    return 0;
  }
  let target: ApiConnection;
  try {
    target = resolveApiConnection(plan.apiFlags);
  } catch (err) {
    process.stderr.write(`slotbroker submit: ${(err as Error).message}\n`);
    return 2;
  }
  const api = target.url;
  const credentials = target.credentials;
  const client = createQueueClient(api, credentials);
  const abort = new AbortController();
  const onSignal = (): void => abort.abort();
  process.once("SIGINT", onSignal);
  let input: PreparedInput | undefined;
  try {
    input = plan.stdinPath === undefined ? undefined : await prepareInput(plan.stdinPath, api, { local: plan.request.local !== undefined, signal: abort.signal, credentials });
  } catch (err) {
    process.off("SIGINT", onSignal);
    process.stderr.write(`slotbroker submit: --stdin ${plan.stdinPath}: ${describeApiError(err, target)}\n`);
    return (err as { code?: unknown }).code === "ENOENT" ? 2 : 1;
  }
  try {
    const request = input && "upload" in input ? withUpload(plan.request, input.upload.id) : withStdin(plan.request, input?.inline);
    const { item, created } = await client.submit(request, { signal: abort.signal });
    if (!item) throw new Error("the fylr answered without an item");
    if (!plan.wait) {
      process.stderr.write(`${created ? "submitted" : "already submitted (idempotency key)"}: item ${item.id}, ${stateName(item.state)}\n`);
      process.stdout.write(plan.json ? `${JSON.stringify(toJson(ItemSchema, item), null, 2)}\n` : `${item.id}\n`);
      return 0;
    }
    process.stderr.write(`item ${item.id}${created ? "" : " (already submitted with this idempotency key)"}\n`);
    const progress = new Progress(process.stderr);
    const final = await followItem(client, item.id, {
      signal: abort.signal,
      onUpdate: (update) => progress.show(update),
      onRetry: (err, attempt) => progress.note(`lost the watch (${err.rawMessage}); watching again (${attempt})`),
    });
    progress.done();
    return await report(final, plan.json, target, abort.signal);
  } catch (err) {
    if (abort.signal.aborted) {
      process.stderr.write(`\nslotbroker submit: stopped waiting; the item stays in the queue\n`);
      return 130;
    }
    const e = ConnectError.from(err);
    process.stderr.write(`slotbroker submit: ${describeApiError(err, target)} (${api} from ${target.source}, ${codeName(e)})\n`);
    return 1;
  } finally {
    process.off("SIGINT", onSignal);
  }
}

async function report(item: Item, json: boolean, target: ApiConnection, signal: AbortSignal): Promise<number> {
  for (const line of receiptLines(item)) process.stderr.write(`${line}\n`);
  const failed = item.state !== ItemState.SUCCEEDED;
  if (failed) process.stderr.write(`item ${item.id} failed after ${item.attempts} attempt(s): ${item.error || "no reason given"}\n`);
  if (json) {
    process.stdout.write(`${JSON.stringify(toJson(ItemSchema, item), null, 2)}\n`);
    return failed ? 1 : 0;
  }
  if (failed || !item.outputStored) {
    process.stdout.write(item.output);
    return failed ? 1 : 0;
  }
  // A stored output streams from the fylr's store straight to standard output.
  const got = await downloadOutput(target.url, item.id, process.stdout, { signal, end: false, credentials: target.credentials });
  if (got.sha256 !== item.outputSha256) {
    process.stderr.write(`slotbroker submit: the output of item ${item.id} arrived with SHA-256 ${got.sha256}, the item says ${item.outputSha256}\n`);
    return 1;
  }
  return 0;
}

// The first call reads a stored upload.
function withUpload(request: SubmitRequest, id: string): SubmitRequest {
  if (request.calls[0]) request.calls[0].stdin = { case: "stdinUpload", value: id };
  return request;
}

function codeName(e: ConnectError): string {
  return Code[e.code] ?? `code ${e.code}`;
}

// A live line on a terminal; plain lines (each change once) otherwise.
class Progress {
  private last = "";
  private live = false;

  constructor(private readonly out: NodeJS.WriteStream) {}

  show(update: WatchResponse): void {
    const line = progressLine(update);
    if (line === this.last) return;
    this.last = line;
    if (this.out.isTTY) {
      this.out.write(`\r\x1b[2K${line.slice(0, Math.max(20, (this.out.columns ?? 100) - 1))}`);
      this.live = true;
    } else {
      this.out.write(`${line}\n`);
    }
  }

  note(text: string): void {
    this.done();
    this.out.write(`${text}\n`);
  }

  done(): void {
    if (this.live) this.out.write("\n");
    this.live = false;
  }
}
