// One process hosting several complete fylrs (startFylr: each its own database pools,
// broker client and connections, HTTP port, dispatcher), so a load scenario can run 50+
// fylrs on 2 cores. A small control port lets the k6 script make fylrs come and go:
//   GET  /fylrs           [{id, http, claimed, succeeded, held, admission, …}] of the running
//                         fylrs: their dispatcher counters, all taken at one instant
//   GET  /queued          items queued and not claimed (Postgres)
//   GET  /claims          {cut, claims: {fylr id: n}}: items whose last claim was made before
//                         the cut-off (a second ago, Postgres time), per claiming fylr
//   POST /join            starts one more fylr → {id, http, startedMs, returnedAt (epoch ms)}
//   POST /leave?id=ID     graceful stop of one fylr (its running items finish or go back)
//   POST /crash           answers, then SIGKILLs this whole process: its fylrs vanish
//                         without a goodbye, and their claims wait to be rescued
//   GET  /held?ids=A,B    items still claimed or running under those fylr ids (Postgres)
//   node --import tsx load/fylr-host.ts CONFIG.json
// CONFIG.json: { name, fylrs, fylr: <FylrConfigInput without name and listen>, greedyHeadroom? }.
// Prints `fylr-host listening control=HOST:PORT` once every initial fylr runs.
import { readFileSync } from "node:fs";
import { createServer, type IncomingMessage, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import pg from "pg";
import { compileFylrConfig, startFylr, type FylrConfigInput, type FylrHandle } from "../src/app/index.js";
import { createLogger, silentLogger } from "../src/shared/log.js";

interface HostConfig {
  readonly name: string;
  readonly fylrs: number;
  readonly fylr: Omit<FylrConfigInput, "name" | "listen">;
  /** Only to see the fairness thresholds fail: the host's first fylr claims with this headroom. */
  readonly greedyHeadroom?: number;
}

const config = JSON.parse(readFileSync(process.argv[2]!, "utf8")) as HostConfig;
const level = process.env.SLOTBROKER_LOG_LEVEL;
const logger = level && level !== "silent" ? createLogger({ level }) : silentLogger;
const fylrs = new Map<string, FylrHandle>();
let started = 0;
const db = new pg.Pool({ connectionString: config.fylr.databaseUrl, max: 1 });

async function join(): Promise<FylrHandle> {
  const index = started++;
  const greedy = index === 0 && config.greedyHeadroom !== undefined;
  const input = greedy ? { ...config.fylr, dispatcher: { ...config.fylr.dispatcher, headroom: config.greedyHeadroom } } : config.fylr;
  const fylr = await startFylr(compileFylrConfig({ ...input, name: `${config.name}-${index}`, listen: "127.0.0.1:0" }), { logger });
  fylrs.set(fylr.id, fylr);
  return fylr;
}

const CLAIMS = `
  WITH cut AS (SELECT now() - interval '1 second' AS t)
  SELECT cut.t AS cut, q.claimed_by AS id, count(q.id)::int AS n
  FROM cut LEFT JOIN queue_items q ON q.claimed_by IS NOT NULL AND q.claimed_at < cut.t
  GROUP BY cut.t, q.claimed_by`;

const describe = (f: FylrHandle): { id: string; http: string } => ({ id: f.id, http: f.address });

// One in-process snapshot of every fylr's claim counters: taken in the same turn of the
// event loop, so the fylrs of one host are compared at the same instant.
const counters = (f: FylrHandle): Record<string, string | number> => {
  const s = f.dispatcher.stats();
  return {
    ...describe(f),
    claimed: s.counters.claimed,
    succeeded: s.counters.succeeded,
    failed: s.counters.failed,
    requeued: s.counters.requeued,
    held: s.execHeld,
    admission: s.execAdmission,
    instances: s.shares.length,
    parked: f.broker.parked,
    running: f.broker.running,
  };
};

async function handle(request: IncomingMessage, response: ServerResponse): Promise<void> {
  const url = new URL(request.url ?? "/", "http://host");
  const send = (status: number, body: unknown): void => {
    response.writeHead(status, { "content-type": "application/json" }).end(JSON.stringify(body));
  };
  if (request.method === "GET" && url.pathname === "/fylrs") return send(200, [...fylrs.values()].map(counters));
  if (request.method === "GET" && url.pathname === "/claims") {
    // Claims per fylr up to a cut-off a second back (later claims may not have committed),
    // all in Postgres time: one consistent count for every fylr of every host.
    const { rows } = await db.query<{ cut: Date; id: string | null; n: number }>(CLAIMS);
    const claims: Record<string, number> = {};
    for (const r of rows) if (r.id !== null) claims[r.id] = r.n;
    return send(200, { cut: rows[0]?.cut.getTime(), claims });
  }
  if (request.method === "GET" && url.pathname === "/queued") {
    const { rows } = await db.query<{ n: number }>(`SELECT count(*)::int AS n FROM queue_items WHERE state = 'queued'`);
    return send(200, { queued: rows[0]!.n });
  }
  if (request.method === "POST" && url.pathname === "/join") {
    const t0 = Date.now();
    const fylr = await join();
    return send(200, { ...describe(fylr), startedMs: Date.now() - t0, returnedAt: Date.now() });
  }
  if (request.method === "POST" && url.pathname === "/leave") {
    const fylr = fylrs.get(url.searchParams.get("id") ?? "");
    if (!fylr) return send(404, { error: `no fylr ${url.searchParams.get("id")} here` });
    fylrs.delete(fylr.id);
    await fylr.close();
    return send(200, { left: fylr.id });
  }
  if (request.method === "POST" && url.pathname === "/crash") {
    response.on("finish", () => process.kill(process.pid, "SIGKILL"));
    return send(200, { crashing: [...fylrs.keys()] });
  }
  if (request.method === "GET" && url.pathname === "/held") {
    const ids = (url.searchParams.get("ids") ?? "").split(",").filter(Boolean);
    const { rows } = await db.query<{ n: number }>(`SELECT count(*)::int AS n FROM queue_items WHERE state IN ('claimed', 'running') AND claimed_by = ANY($1)`, [ids]);
    return send(200, { held: rows[0]!.n });
  }
  send(404, { error: `no route ${request.method} ${url.pathname}` });
}

const server = createServer((request, response) => {
  handle(request, response).catch((err: unknown) => {
    if (!response.headersSent) response.writeHead(500, { "content-type": "application/json" });
    response.end(JSON.stringify({ error: (err as Error).message }));
  });
});

// All at once: migrations hold an advisory lock, so concurrent starts wait for the first.
await Promise.all(Array.from({ length: config.fylrs }, () => join()));
await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
process.stdout.write(`fylr-host listening control=127.0.0.1:${(server.address() as AddressInfo).port}\n`);

let stopping = false;
process.on("SIGTERM", () => {
  if (stopping) return;
  stopping = true;
  server.close();
  void Promise.allSettled([...fylrs.values()].map((f) => f.close())).then(async () => {
    await db.end();
    process.exit(0);
  });
});
