import { chmodSync, mkdtempSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createDatabase } from "../../harness/databases.js";
import { startEmbeddedPostgres, type LocalPostgres } from "../../src/shared/embedded-postgres.js";

/** Set by the run's global setup: the admin URL of the one server all workers share. */
const SHARED_ENV = "SLOTBROKER_TEST_POSTGRES";

let server: Promise<LocalPostgres> | undefined;

function startServer(): Promise<LocalPostgres> {
  const dir = mkdtempSync(join(tmpdir(), "slotbroker-test-pg-"));
  chmodSync(dir, 0o755); // the server runs as the "postgres" user when we are root
  return startEmbeddedPostgres({ dataDir: join(dir, "data"), persistent: false });
}

/**
 * A real PostgreSQL for tests: DATABASE_URL when set; else the server the run's global
 * setup started (shared by every mocha worker); else one embedded server of this process,
 * started on first use.
 */
async function adminUrl(): Promise<string> {
  if (process.env.DATABASE_URL) return process.env.DATABASE_URL;
  const shared = process.env[SHARED_ENV];
  if (shared) return shared;
  server ??= startServer();
  return (await server).url;
}

/** Global setup: starts the run's one embedded server (unless DATABASE_URL names one). */
export async function startSharedTestPostgres(): Promise<void> {
  if (process.env.DATABASE_URL || process.env[SHARED_ENV]) return;
  server ??= startServer();
  process.env[SHARED_ENV] = (await server).url;
}

/** Creates a fresh, empty database and returns its URL. One per test file. */
export async function createTestDatabase(prefix = "t"): Promise<string> {
  return (await createDatabase(await adminUrl(), prefix)).url;
}

/** Stops the embedded server if this process started one. */
export async function stopTestPostgres(): Promise<void> {
  if (!server) return;
  const s = await server;
  server = undefined;
  await s.stop();
}
