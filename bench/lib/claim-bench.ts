// The set-up the claim benches share (claim-fairness, fairness-keys): a migrated database
// of their own — on DATABASE_URL's server when set, else on an embedded server in a temp
// dir — a pool on it and one in-process execserver; close() takes it all down again.
import { randomBytes } from "node:crypto";
import { chmodSync, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import pg from "pg";
import { startExecserver, type ExecserverHandle } from "../../src/app/execserver.js";
import { migrate } from "../../src/dispatcher/index.js";
import { compileExecserverConfig, type ExecserverConfigInput } from "../../src/execserver/index.js";
import { startEmbeddedPostgres, type LocalPostgres } from "../../src/shared/embedded-postgres.js";
import { createPgPool } from "../../src/shared/postgres.js";

/** A claim bench's database and execserver. */
export interface ClaimBench {
  /** The bench's own database. */
  readonly url: string;
  readonly pool: pg.Pool;
  readonly exec: ExecserverHandle;
  /** Stops the execserver, drops the database and stops an embedded server. */
  close(): Promise<void>;
}

/**
 * Creates database `bench_<name>_<8 hex>`, migrates it, opens a pool of `poolSize` on it
 * and starts the execserver `execserver` (listening on loopback port 0).
 */
export async function startClaimBench(name: string, options: { poolSize: number; execserver: Omit<ExecserverConfigInput, "listen" | "adminListen"> }): Promise<ClaimBench> {
  let adminUrl = process.env.DATABASE_URL;
  let server: LocalPostgres | undefined;
  let dataRoot: string | undefined;
  if (!adminUrl) {
    dataRoot = mkdtempSync(join(tmpdir(), `slotbroker-bench-${name}-`));
    chmodSync(dataRoot, 0o755);
    server = await startEmbeddedPostgres({ dataDir: join(dataRoot, "data"), persistent: false });
    adminUrl = server.url;
  }
  const admin = new pg.Client(adminUrl);
  await admin.connect();
  const database = `bench_${name}_${randomBytes(4).toString("hex")}`;
  const url = new URL(adminUrl);
  url.pathname = `/${database}`;
  let exec: ExecserverHandle | undefined;
  let pool: pg.Pool | undefined;
  const close = async (): Promise<void> => {
    await exec?.forceClose().catch(() => undefined);
    await pool?.end().catch(() => undefined);
    await admin.query(`DROP DATABASE IF EXISTS ${database} WITH (FORCE)`).catch(() => undefined);
    await admin.end();
    await server?.stop();
    if (dataRoot) rmSync(dataRoot, { recursive: true, force: true });
  };
  try {
    await admin.query(`CREATE DATABASE ${database}`);
    await migrate(url.toString());
    pool = createPgPool({ connectionString: url.toString(), max: options.poolSize });
    exec = await startExecserver(compileExecserverConfig({ ...options.execserver, listen: "127.0.0.1:0", adminListen: "127.0.0.1:0" }, "bench"));
    return { url: url.toString(), pool, exec, close };
  } catch (err) {
    await close();
    throw err;
  }
}

/** Polls `check` every `everyMs` until it holds; throws naming `what` after `timeoutMs`. */
export async function until(what: string, check: () => boolean | Promise<boolean>, { timeoutMs, everyMs }: { timeoutMs: number; everyMs: number }): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!(await check())) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, everyMs));
  }
}

/** Jain's fairness index: 1.0 when every value is the same. */
export function jain(values: readonly number[]): number {
  const sum = values.reduce((a, b) => a + b, 0);
  const squares = values.reduce((a, b) => a + b * b, 0);
  return squares === 0 ? 0 : (sum * sum) / (values.length * squares);
}
