/**
 * The database a fylr is pointed at, created when it is missing and the role may create
 * databases; otherwise an error that says exactly what to run.
 */
import pg from "pg";
import { Code, SlotbrokerError } from "../../shared/errors.js";
import { silentLogger, type Logger } from "../../shared/log.js";
import { fromPgError, sqlState } from "./pg-errors.js";

/** What ensureDatabase found. */
export type DatabaseOutcome = "exists" | "created";

/**
 * Connects to the database of `url`; if it does not exist (SQLSTATE 3D000), connects to the
 * server's "postgres" database with the same credentials and creates it. Throws a
 * SlotbrokerError naming the database, the server and the command to run when it cannot.
 */
export async function ensureDatabase(url: string, options: { logger?: Logger } = {}): Promise<DatabaseOutcome> {
  const log = (options.logger ?? silentLogger).child({ component: "database" });
  const target = new URL(url);
  const name = decodeURIComponent(target.pathname.slice(1)) || decodeURIComponent(target.username) || "postgres";
  if (await connects(url)) return "exists";
  const server = `${target.hostname}:${target.port || "5432"}`;
  const role = decodeURIComponent(target.username) || "(default user)";
  const how = `ask an administrator to run CREATE DATABASE ${quote(name)} OWNER ${quote(role)} on ${server}, or point databaseUrl / DATABASE_URL at an existing database`;
  const admin = new URL(url);
  admin.pathname = "/postgres";
  const client = new pg.Client({ connectionString: admin.toString() });
  client.on("error", () => undefined);
  try {
    await client.connect();
  } catch (err) {
    throw new SlotbrokerError(Code.NotFound, `database "${name}" does not exist on ${server}, and its "postgres" database is not reachable to create it (${(err as Error).message}); ${how}`, {
      cause: err,
    });
  }
  try {
    await client.query(`CREATE DATABASE ${client.escapeIdentifier(name)}`);
    log.info({ database: name, server }, "created the database");
    return "created";
  } catch (err) {
    const state = sqlState(err);
    // Another fylr created it a moment ago (duplicate_database, or the catalog's unique index).
    if (state === "42P04" || state === "23505") return "exists";
    if (state === "42501") {
      throw new SlotbrokerError(Code.PermissionDenied, `database "${name}" does not exist on ${server}, and role ${quote(role)} may not create databases; ${how}`, { cause: err });
    }
    throw new SlotbrokerError(Code.Internal, `database "${name}" does not exist on ${server}, and creating it failed: ${(err as Error).message}; ${how}`, { cause: err });
  } finally {
    await client.end().catch(() => undefined);
  }
}

// true when the database is there; false only for "does not exist"; anything else is thrown as is.
async function connects(url: string): Promise<boolean> {
  const client = new pg.Client({ connectionString: url });
  client.on("error", () => undefined);
  try {
    await client.connect();
    return true;
  } catch (err) {
    if (sqlState(err) === "3D000") return false;
    throw fromPgError(err, `connect to ${new URL(url).host}`);
  } finally {
    await client.end().catch(() => undefined);
  }
}

function quote(identifier: string): string {
  return `"${identifier.replace(/"/g, '""')}"`;
}
