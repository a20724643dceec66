import { randomBytes } from "node:crypto";
import pg from "pg";

/**
 * A pg.Pool that never crashes the process over an idle connection: when the server
 * restarts or stops, pg emits 'error' on the pool for idle clients, and an 'error' event
 * without a listener is fatal in Node. The next query reconnects.
 */
export function createPgPool(config: pg.PoolConfig, onIdleError: (err: Error) => void = () => undefined): pg.Pool {
  const pool = new pg.Pool(config);
  pool.on("error", onIdleError);
  return pool;
}

/**
 * Creates a fresh, empty database named `<prefix>_<12 hex>` on the server at `adminUrl`
 * and returns its name and URL.
 */
export async function createDatabase(adminUrl: string, prefix: string): Promise<{ name: string; url: string }> {
  const name = `${prefix}_${randomBytes(6).toString("hex")}`;
  const client = new pg.Client(adminUrl);
  await client.connect();
  try {
    await client.query(`CREATE DATABASE ${name}`);
  } finally {
    await client.end();
  }
  const url = new URL(adminUrl);
  url.pathname = `/${name}`;
  return { name, url: url.toString() };
}
