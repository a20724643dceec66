// Starting the servers a scenario needs, as real `slotbroker` processes on loopback ports
// chosen by the kernel (listen on port 0, read the address from the start-up line).
import { chmodSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import pg from "pg";
import { stringify } from "yaml";
import type { ExecserverConfigInput } from "../src/execserver/index.js";
import type { FylrConfigInput } from "../src/app/index.js";
import type { Supervisor } from "./processes.js";
import { createDatabase } from "../harness/databases.js";
import { nodeScript } from "../harness/node-children.js";

/** Where the servers run from, and who supervises them. */
export interface ServerContext {
  readonly sup: Supervisor;
  /** The checkout whose src/cli.ts is started (normally this one). */
  readonly serverRoot: string;
  /** The admin URL of the run's PostgreSQL server (see runPostgres). */
  readonly postgres: () => Promise<string>;
}

/** A started execserver. */
export interface ExecserverInfo {
  readonly instanceId: string;
  /** "127.0.0.1:PORT" of BrokerService. */
  readonly grpc: string;
  readonly admin: string;
  readonly pid: number;
}

/** A started fylr. */
export interface FylrInfo {
  readonly id: string;
  /** "127.0.0.1:PORT" of its HTTP port (QueueService JSON). */
  readonly http: string;
  readonly pid: number;
}

const logLevel = (): string => process.env.SLOTBROKER_LOAD_LOG_LEVEL ?? "warn";

/** Starts `slotbroker execserver` with `config` (listen addresses default to loopback port 0). */
export async function startExecserverProcess(ctx: ServerContext, name: string, config: Omit<ExecserverConfigInput, "listen" | "adminListen">): Promise<ExecserverInfo> {
  const dir = ctx.sup.tempDir(name);
  const path = join(dir, "execserver.yaml");
  writeFileSync(path, stringify({ listen: "127.0.0.1:0", adminListen: "127.0.0.1:0", drainTimeout: "2s", ...config }));
  const started = await ctx.sup.start(
    name,
    process.execPath,
    [...nodeScript(join(ctx.serverRoot, "src", "cli.ts")), "execserver", "--config", path],
    /^execserver (\S+) listening grpc=(\S+) admin=(\S+)$/m,
    { cwd: ctx.serverRoot, env: { SLOTBROKER_LOG_LEVEL: logLevel() } },
  );
  const [, instanceId, grpc, admin] = started.banner;
  return { instanceId: instanceId!, grpc: grpc!, admin: admin!, pid: started.child.pid! };
}

/** Starts `slotbroker fylr` with `config` (listen defaults to loopback port 0). */
export async function startFylrProcess(ctx: ServerContext, name: string, config: Omit<FylrConfigInput, "listen">): Promise<FylrInfo> {
  const dir = ctx.sup.tempDir(name);
  const path = join(dir, "fylr.yaml");
  writeFileSync(path, stringify({ name, listen: "127.0.0.1:0", ...config }));
  const started = await ctx.sup.start(
    name,
    process.execPath,
    [...nodeScript(join(ctx.serverRoot, "src", "cli.ts")), "fylr", "--config", path],
    /^fylr (\S+) listening http=(\S+)$/m,
    { cwd: ctx.serverRoot, env: { SLOTBROKER_LOG_LEVEL: logLevel() } },
  );
  const [, id, http] = started.banner;
  return { id: id!, http: http!.replace(/^https?:\/\//, ""), pid: started.child.pid! };
}

/**
 * The PostgreSQL server of a whole run, started on first use and shared by its scenarios
 * (each gets a database of its own): DATABASE_URL's server when set, otherwise an embedded
 * one that `sup` (the run's supervisor, not a scenario's) stops and deletes.
 */
export function runPostgres(sup: Supervisor): () => Promise<string> {
  let admin: Promise<string> | undefined;
  return () =>
    (admin ??= (async () => {
      if (process.env.DATABASE_URL) return process.env.DATABASE_URL;
      const dir = sup.tempDir("pg");
      chmodSync(dir, 0o755); // as root the server runs as the "postgres" user
      const { startEmbeddedPostgres } = await import("../src/shared/embedded-postgres.js");
      // fylr-churn's local profile runs up to 72 fylrs of four connections each (pool of 2,
      // heartbeat, LISTEN), plus a migration client each while they start together.
      const server = await startEmbeddedPostgres({ dataDir: join(dir, "data"), persistent: false, maxConnections: 500 });
      sup.onStop("postgres", () => server.stop());
      return server.url;
    })());
}

/** A fresh, empty database on the run's server, dropped when the scenario stops. */
export async function freshDatabase(ctx: ServerContext): Promise<string> {
  const admin = await ctx.postgres();
  const { name, url } = await createDatabase(admin, "load");
  ctx.sup.onStop(`database ${name}`, () => dropDatabase(admin, name));
  return url;
}

/** Postgres, two execservers (service `sleep`) and fylrs using both, for the queue scenarios. */
export interface QueueStack {
  readonly databaseUrl: string;
  readonly fylrs: readonly FylrInfo[];
}

/**
 * Starts a QueueStack: two execservers `exec-NAME-a`/`-b` with `processes` slots each and
 * `fylrs` fylr processes `fylr-0`… (headroom `headroom`, stopGrace 2 s) on a fresh database.
 */
export async function startQueueStack(ctx: ServerContext, name: string, size: { fylrs: number; processes: number; headroom: number }): Promise<QueueStack> {
  const [databaseUrl, execs] = await Promise.all([
    freshDatabase(ctx),
    Promise.all(
      ["a", "b"].map((suffix) =>
        startExecserverProcess(ctx, `exec-${name}-${suffix}`, {
          instanceId: `load-${name}-${suffix}`,
          waitgroups: { work: { processes: size.processes } },
          services: { sleep: { waitgroup: "work", command: ["sleep"], timeout: "1m" } },
        }),
      ),
    ),
  ]);
  // All at once: the migrations' advisory lock lets one fylr migrate while the rest wait.
  const fylrs = await Promise.all(
    Array.from({ length: size.fylrs }, (_, i) =>
      startFylrProcess(ctx, `fylr-${i}`, {
        databaseUrl,
        databasePoolSize: 5,
        execserver: { addresses: execs.map((e) => e.grpc) },
        dispatcher: { headroom: size.headroom, stopGrace: "2s" },
      }),
    ),
  );
  return { databaseUrl, fylrs };
}

async function dropDatabase(admin: string, name: string): Promise<void> {
  const client = new pg.Client(admin);
  await client.connect();
  try {
    await client.query(`DROP DATABASE IF EXISTS ${name} WITH (FORCE)`);
  } finally {
    await client.end();
  }
}
