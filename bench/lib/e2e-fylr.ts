// One fylr for the end-to-end bench, in its own process: the real fylr (startFylr: pool,
// broker client, pipes, QueueService, dispatcher) with a listener on its lifecycle events
// that prints, per finished item, when it passed each stage (epoch ms, sub-ms):
//   {"item":ID,"ok":true,"claimed":…,"waiting":…,"running":…,"finishing":…,"settled":…}
// claimed: item:claimed; waiting: its WANT is parked; running: the OFFER came and the JOB
// went out (the fylr answers an OFFER at once); finishing: DONE came and the stdout is
// collected; settled: the success is written. Config: the FylrConfigInput as JSON in argv[2].
// With E2E_TIMELINE=1 it also prints, per Submit request, when its request came in (Node's
// HTTP diagnostics channel) and when its answer was written (the response's end returned;
// the answer is small, so its bytes went to the socket then). Off by default:
//   {"submitRequest":…,"submitAnswer":…}
import { subscribe } from "node:diagnostics_channel";
import type { IncomingMessage, ServerResponse } from "node:http";
import { performance } from "node:perf_hooks";
import { compileFylrConfig, startFylr } from "../../src/app/index.js";
import { startTracing } from "../../src/shared/tracing/index.js";

const epochMs = (): number => performance.timeOrigin + performance.now();
const config = compileFylrConfig(JSON.parse(process.argv[2]!), "e2e-fylr", process.env);
// As `slotbroker fylr` does: traces only when the OTEL_* variables ask for them.
await startTracing("slotbroker-fylr");
const fylr = await startFylr(config);
type Stages = { claimed?: number; waiting?: number; running?: number; finishing?: number };
const stages = new Map<string, Stages>();
// Lines finished in one turn of the event loop go out in one write.
const out: string[] = [];
const flush = (): void => void process.stdout.write(out.splice(0).join(""));
fylr.dispatcher.events.on("item:claimed", (item) => void stages.set(item.id, { claimed: epochMs() }));
fylr.dispatcher.events.on("item:changed", (live, removed) => {
  const s = stages.get(live.id);
  if (!s || removed) return;
  if (live.phase === "waiting" || live.phase === "running" || live.phase === "finishing") s[live.phase] ??= epochMs();
});
const finished = (id: string, ok: boolean): void => {
  const s = stages.get(id);
  stages.delete(id);
  if (out.push(`${JSON.stringify({ item: id, ok, ...s, settled: epochMs() })}\n`) === 1) setImmediate(flush);
};
fylr.dispatcher.events.on("item:succeeded", (item) => finished(item.id, true));
if (process.env.E2E_TIMELINE) {
  subscribe("http.server.request.start", (message) => {
    const { request, response } = message as { request: IncomingMessage; response: ServerResponse };
    if (request.url !== "/slotbroker.v1.QueueService/Submit") return;
    const submitRequest = epochMs();
    const end = response.end.bind(response) as (...args: unknown[]) => ServerResponse;
    response.end = ((...args: unknown[]) => {
      const ended = end(...args);
      if (out.push(`${JSON.stringify({ submitRequest, submitAnswer: epochMs() })}\n`) === 1) setImmediate(flush);
      return ended;
    }) as typeof response.end;
  });
}
fylr.dispatcher.events.on("item:failed", (item, error) => {
  process.stderr.write(`e2e-fylr: item ${item.id} failed: ${error}\n`);
  finished(item.id, false);
});
// How often the claim loop ran and why, for the bench's "where the time goes".
const wakeups: Record<string, number> = {};
let passes = 0;
let emptyPasses = 0;
fylr.dispatcher.events.on("wakeup", (source) => void (wakeups[source] = (wakeups[source] ?? 0) + 1));
fylr.dispatcher.events.on("pass", (claimed) => {
  passes++;
  if (claimed === 0) emptyPasses++;
});
// E2E_COUNT_STATEMENTS=1: statements through the dispatcher's pool by their first words,
// and notifications heard, printed at the end.
const statements = new Map<string, number>();
if (process.env.E2E_COUNT_STATEMENTS) {
  const pool = fylr.dispatcher.queue.pool;
  const query = pool.query.bind(pool) as (...args: unknown[]) => unknown;
  (pool as unknown as { query: (...args: unknown[]) => unknown }).query = (...args: unknown[]) => {
    const first = args[0] as string | { text: string };
    const key = (typeof first === "string" ? first : first.text).trim().replace(/\s+/g, " ").slice(0, 50);
    statements.set(key, (statements.get(key) ?? 0) + 1);
    return query(...args);
  };
  fylr.dispatcher.events.on("queue:changed", () => void statements.set("(notification: changed id)", (statements.get("(notification: changed id)") ?? 0) + 1));
}
process.stdout.write(`e2e-fylr ready url=${fylr.url}\n`);
process.on("SIGTERM", () => {
  process.stderr.write(`e2e-fylr ${config.id}: ${passes} claim passes (${emptyPasses} claimed nothing), wakeups ${JSON.stringify(wakeups)}\n`);
  if (statements.size > 0) process.stderr.write(`e2e-fylr ${config.id}: statements ${JSON.stringify(Object.fromEntries(statements))}\n`);
  void fylr.close().finally(() => process.exit(0));
});
