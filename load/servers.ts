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
 * A fresh, empty database: on DATABASE_URL's server when set, otherwise on an embedded
 * PostgreSQL started for this scenario (stopped and deleted by the supervisor).
 */
export async function freshDatabase(ctx: ServerContext): Promise<string> {
  let admin = process.env.DATABASE_URL;
  if (!admin) {
    const dir = ctx.sup.tempDir("pg");
    chmodSync(dir, 0o755); // as root the server runs as the "postgres" user
    const { startEmbeddedPostgres } = await import("../src/shared/embedded-postgres.js");
    const server = await startEmbeddedPostgres({ dataDir: join(dir, "data"), persistent: false });
    ctx.sup.onStop("postgres", () => server.stop());
    admin = server.url;
  }
  const { name, url } = await createDatabase(admin, "load");
  if (process.env.DATABASE_URL) ctx.sup.onStop(`database ${name}`, () => dropDatabase(admin, name));
  return url;
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
