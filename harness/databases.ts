import { randomBytes } from "node:crypto";
import pg from "pg";

/**
 * Creates a fresh, empty database named `<prefix>_<12 hex>` on the server at `adminUrl`
 * and returns its name and URL. For tests, benchmarks and the load runner.
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
