import { chmodSync, mkdtempSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createDatabase } from "./databases.js";
import { startEmbeddedPostgres, type LocalPostgres } from "../../src/shared/embedded-postgres.js";

let server: Promise<LocalPostgres> | undefined;

/**
 * A real PostgreSQL for tests: DATABASE_URL when set, otherwise one embedded server per
 * test run (started on first use, stopped by the root hooks).
 */
async function adminUrl(): Promise<string> {
  if (process.env.DATABASE_URL) return process.env.DATABASE_URL;
  if (!server) {
    const dir = mkdtempSync(join(tmpdir(), "slotbroker-test-pg-"));
    chmodSync(dir, 0o755); // the server runs as the "postgres" user when we are root
    server = startEmbeddedPostgres({ dataDir: join(dir, "data"), persistent: false });
  }
  return (await server).url;
}

/** Creates a fresh, empty database and returns its URL. One per test file. */
export async function createTestDatabase(prefix = "t"): Promise<string> {
  return (await createDatabase(await adminUrl(), prefix)).url;
}

/** Stops the embedded server if this run started one. */
export async function stopTestPostgres(): Promise<void> {
  if (!server) return;
  const s = await server;
  server = undefined;
  await s.stop();
}
