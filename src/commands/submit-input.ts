/**
 * How `slotbroker submit --stdin FILE` sends its input: small inputs inline in the Submit,
 * larger ones streamed to the fylr's store first (`POST /queue/inputs`) and referred to
 * by id. Standard input ("-") is read up to the inline size to decide, then streamed.
 */
import { createReadStream, readFileSync, statSync } from "node:fs";
import { Readable } from "node:stream";
import type { ApiCredentials } from "../api/client.js";
import { uploadInput, type StoredUpload } from "../api/store-client.js";

/** Inputs up to this size ride inside the Submit (under the fylr's 4 MiB inline default). */
export const INLINE_INPUT_BYTES = 1 << 20;

/** The first call's stdin: bytes to send inline, or an upload already stored. */
export type PreparedInput = { readonly inline: Uint8Array } | { readonly upload: StoredUpload };

/** Reads or uploads `path` ("-" = standard input); `local` inputs are always inline. */
export async function prepareInput(
  path: string,
  api: string,
  options: { local: boolean; signal?: AbortSignal; credentials?: ApiCredentials },
): Promise<PreparedInput> {
  if (path !== "-") {
    const size = statSync(path).size;
    if (options.local || size <= INLINE_INPUT_BYTES) return { inline: readFileSync(path) };
    return { upload: await uploadInput(api, createReadStream(path, { highWaterMark: 1 << 20 }), { size, signal: options.signal, credentials: options.credentials }) };
  }
  const head: Buffer[] = [];
  let headBytes = 0;
  const stdin = process.stdin;
  const iterator = (stdin as AsyncIterable<Buffer>)[Symbol.asyncIterator]();
  for (;;) {
    if (!options.local && headBytes > INLINE_INPUT_BYTES) break;
    const next = await iterator.next();
    if (next.done) return { inline: Buffer.concat(head, headBytes) };
    head.push(next.value);
    headBytes += next.value.length;
  }
  // More than fits inline: what was read so far, then the rest of standard input.
  const rest = Readable.from(
    (async function* () {
      yield* head;
      for (let next = await iterator.next(); !next.done; next = await iterator.next()) yield next.value;
    })(),
    { objectMode: false },
  );
  return { upload: await uploadInput(api, rest, { signal: options.signal, credentials: options.credentials }) };
}
