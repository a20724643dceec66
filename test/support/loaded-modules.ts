/**
 * Run as a script: `node --import tsx test/support/loaded-modules.ts ENTRY` imports ENTRY
 * and prints, as one JSON line, every module that import loaded: the ESM graph (recorded
 * by a resolve hook, after tsx mapped ".js" to ".ts") and the CommonJS modules
 * (require.cache; pg and most npm packages are CommonJS).
 */
import { createRequire, register } from "node:module";
import { resolve } from "node:path";
import { pathToFileURL } from "node:url";
import { MessageChannel } from "node:worker_threads";

// Runs on the loader thread; posts each resolved URL back in order.
const hooks = `
let port;
export function initialize(data) { port = data.port; }
export async function resolve(specifier, context, next) {
  const result = await next(specifier, context);
  port.postMessage(result.url);
  return result;
}`;

const entry = process.argv[2];
if (!entry) throw new Error("usage: loaded-modules.ts ENTRY");
const sentinel = "data:text/javascript,export default 'loaded-modules sentinel'";
const { port1, port2 } = new MessageChannel();
const esm: string[] = [];
const done = new Promise<void>((resolveDone) => {
  port1.on("message", (url: string) => {
    if (url === sentinel) resolveDone();
    else esm.push(url);
  });
});
register(`data:text/javascript,${encodeURIComponent(hooks)}`, { data: { port: port2 }, transferList: [port2] });
await import(pathToFileURL(resolve(entry)).href);
// Messages arrive in order: once the sentinel's resolution is in, so is everything before.
await import(sentinel);
await done;
port1.close();
const cjs = Object.keys(createRequire(import.meta.url).cache);
process.stdout.write(`${JSON.stringify({ esm, cjs })}\n`);
