import { createWriteStream } from "node:fs";
import { rename, rm } from "node:fs/promises";
import { parseArgs } from "node:util";
import { ItemState } from "../../gen/slotbroker/v1/queue_pb.js";
import { createQueueClient } from "../api/client.js";
import { downloadOutput } from "../api/store-client.js";
import { apiOptions, apiOptionsHelp, describeApiError, resolveApiConnection, type ApiConnection } from "./api-options.js";

const help = `usage: slotbroker output ID [-o FILE] [--api URL]

Fetches the whole output of a finished item from any fylr of the queue and writes it to
standard output, or to FILE (written next to it and renamed into place only when complete
and its SHA-256 matches the item's). Exit code 1 when the item has no output or the bytes
do not match.

  -o, --output FILE  write to FILE instead of standard output
${apiOptionsHelp}
  -h, --help         this text

The same bytes by HTTP, with Range (the token needs the read scope):
  curl -fsS -H "authorization: Bearer $SLOTBROKER_API_TOKEN" -o out.bin \
    http://127.0.0.1:7700/queue/items/ID/output`;

/** `slotbroker output ID [-o FILE]`: resolves with the exit code. */
export async function run(argv: string[]): Promise<number> {
  let values: { output?: string; api?: string; help?: boolean; "token-file"?: string; ca?: string; cert?: string; key?: string };
  let positionals: string[];
  try {
    ({ values, positionals } = parseArgs({
      args: argv,
      options: { output: { type: "string", short: "o" }, ...apiOptions, help: { type: "boolean", short: "h" } },
      allowPositionals: true,
    }));
  } catch (err) {
    process.stderr.write(`slotbroker output: ${(err as Error).message}\n\n${help}\n`);
    return 2;
  }
  if (values.help) {
    process.stdout.write(`${help}\n`);
    return 0;
  }
  const id = positionals[0];
  if (!id || positionals.length > 1) {
    process.stderr.write(`slotbroker output: give exactly one item id\n\n${help}\n`);
    return 2;
  }
  let target: ApiConnection;
  try {
    target = resolveApiConnection(values);
  } catch (err) {
    process.stderr.write(`slotbroker output: ${(err as Error).message}\n`);
    return 2;
  }
  const { url: api, credentials } = target;
  try {
    const { item } = await createQueueClient(api, credentials).get({ id });
    if (!item || item.state !== ItemState.SUCCEEDED) throw new Error(`item ${id} has not succeeded; it has no output`);
    const file = values.output;
    const partial = file && `${file}.partial-${process.pid}`;
    const sink = partial ? createWriteStream(partial) : process.stdout;
    try {
      const got = await downloadOutput(api, id, sink, { end: partial !== undefined, credentials });
      if (got.sha256 !== item.outputSha256) throw new Error(`the output arrived with SHA-256 ${got.sha256}, the item says ${item.outputSha256}`);
      if (partial) await rename(partial, file);
      process.stderr.write(`item ${id}: ${got.size} bytes, sha256 ${got.sha256}${file ? ` → ${file}` : ""}\n`);
    } finally {
      if (partial) await rm(partial, { force: true });
    }
    return 0;
  } catch (err) {
    process.stderr.write(`slotbroker output: ${describeApiError(err, target)}\n`);
    return 1;
  }
}
