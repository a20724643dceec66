/**
 * `slotbroker cancel|retry|delete ID…`: control over items through any fylr of the queue.
 * Each id is one call; the exit code is 1 when any of them was refused.
 */
import { parseArgs } from "node:util";
import { timestampDate } from "@bufbuild/protobuf/wkt";
import { ItemState, type Item } from "../../gen/slotbroker/v1/queue_pb.js";
import { createQueueClient, followItem, type QueueClient } from "../api/client.js";
import { apiOptions, apiOptionsHelp, describeApiError, resolveApiConnection, type ApiConnection, type ApiFlags } from "./api-options.js";
import { stateName } from "./submit-progress.js";

type Verb = "cancel" | "retry" | "delete";

const helps: Record<Verb, string> = {
  cancel: `usage: slotbroker cancel ID… [--wait] [--api URL] [--token-file FILE]

Stops items. A queued or claimed item is cancelled at once; a running one is stopped at its
execserver (SIGTERM, then SIGKILL after the execserver's cancelGrace) through the fylr
holding it, and is cancelled when its job has ended. A finished item is refused.

  --wait             for a running item, wait until it is cancelled
${apiOptionsHelp}
  -h, --help         this text

The token needs the admin scope.`,
  retry: `usage: slotbroker retry ID… [--api URL] [--token-file FILE]

Sends failed or cancelled items back to the queue with fresh attempts. The token needs the
admin scope.

${apiOptionsHelp}
  -h, --help         this text`,
  delete: `usage: slotbroker delete ID… [--api URL] [--token-file FILE]

Removes finished items (succeeded, failed or cancelled) and the inputs and outputs stored
for them. Cancel an unfinished item first. The token needs the admin scope.

${apiOptionsHelp}
  -h, --help         this text`,
};

/** The command for one verb. */
export function controlCommand(verb: Verb): (argv: string[]) => Promise<number> {
  return async (argv) => {
    let values: { wait?: boolean; help?: boolean } & ApiFlags;
    let positionals: string[];
    try {
      ({ values, positionals } = parseArgs({
        args: argv,
        options: { ...apiOptions, help: { type: "boolean", short: "h" }, wait: { type: "boolean" } },
        allowPositionals: true,
      }));
      if (values.wait && verb !== "cancel") throw new Error("--wait: only for cancel");
    } catch (err) {
      process.stderr.write(`slotbroker ${verb}: ${(err as Error).message}\n\n${helps[verb]}\n`);
      return 2;
    }
    if (values.help) {
      process.stdout.write(`${helps[verb]}\n`);
      return 0;
    }
    if (positionals.length === 0) {
      process.stderr.write(`slotbroker ${verb}: give one or more item ids\n\n${helps[verb]}\n`);
      return 2;
    }
    let target: ApiConnection;
    try {
      target = resolveApiConnection(values);
    } catch (err) {
      process.stderr.write(`slotbroker ${verb}: ${(err as Error).message}\n`);
      return 2;
    }
    const client = createQueueClient(target.url, target.credentials);
    let failures = 0;
    for (const id of positionals) {
      try {
        process.stdout.write(`${await once(client, verb, id, values.wait ?? false)}\n`);
      } catch (err) {
        failures++;
        process.stderr.write(`slotbroker ${verb}: ${id}: ${describeApiError(err, target)}\n`);
      }
    }
    return failures > 0 ? 1 : 0;
  };
}

async function once(client: QueueClient, verb: Verb, id: string, wait: boolean): Promise<string> {
  switch (verb) {
    case "cancel": {
      const item = (await client.cancel({ id })).item!;
      if (item.state !== ItemState.RUNNING) return describe(item);
      if (!wait) return `${id} cancel requested (running): it ends cancelled once its job has stopped`;
      return describe(await followItem(client, id));
    }
    case "retry":
      return describe((await client.retry({ id })).item!);
    case "delete": {
      const { blobsDeleted } = await client.delete({ id });
      return `${id} deleted${blobsDeleted > 0 ? ` with ${blobsDeleted} stored input(s)/output(s)` : ""}`;
    }
  }
}

function describe(item: Item): string {
  const finished = item.finishedAt ? ` at ${timestampDate(item.finishedAt).toISOString()}` : "";
  return `${item.id} ${stateName(item.state)}${finished}`;
}

/** `slotbroker cancel ID…`. */
export const cancel = controlCommand("cancel");
/** `slotbroker retry ID…`. */
export const retry = controlCommand("retry");
/** `slotbroker delete ID…`. */
export const remove = controlCommand("delete");
