/**
 * The schema migrator. Migrations are the numbered files in ./migrations
 * (`0001_queue.sql`, `0002_….sql`), applied in order, each in its own transaction, and
 * recorded in `slotbroker_migrations`. The whole run holds a session advisory lock, so any
 * number of fylrs starting at once apply each migration exactly once: the first does the
 * work, the others wait on the lock and then find nothing left to do.
 */
import { createHash } from "node:crypto";
import { readFileSync, readdirSync } from "node:fs";
import { fileURLToPath } from "node:url";
import pg from "pg";
import { Code, SlotbrokerError } from "../../shared/errors.js";
import { silentLogger, type Logger } from "../../shared/log.js";
import { fromPgError } from "./pg-errors.js";

/** One migration file. */
export interface Migration {
  readonly version: number;
  readonly name: string;
  readonly sql: string;
  /** sha256 of the file, recorded so an edited, already-applied file is noticed. */
  readonly checksum: string;
}

/** What a migrate run did. */
export interface MigrationReport {
  /** Versions applied by this run, in order. */
  readonly applied: readonly number[];
  /** The schema version now (the highest recorded). */
  readonly version: number;
}

/** The directory holding the SQL files next to this module. */
export const migrationsDir = fileURLToPath(new URL("./migrations/", import.meta.url));

// "slotbrk" in ASCII; any fixed bigint works, it only has to be the same for every fylr.
const lockKey = "32492533376709227";

const createLedger = `
CREATE TABLE IF NOT EXISTS slotbroker_migrations (
  version    integer PRIMARY KEY,
  name       text NOT NULL,
  checksum   text NOT NULL,
  applied_at timestamptz NOT NULL DEFAULT now()
)`;
const selectLedger = `SELECT version, checksum FROM slotbroker_migrations ORDER BY version`;
const insertLedger = `INSERT INTO slotbroker_migrations (version, name, checksum) VALUES ($1, $2, $3)`;
const lock = `SELECT pg_advisory_lock($1::bigint)`;
const unlock = `SELECT pg_advisory_unlock($1::bigint)`;

/**
 * Reads and orders the migration files. Numbers must be unique; gaps are allowed, because
 * migrations are written on parallel branches and land in any order (a missing lower number
 * that arrives later is applied then).
 */
export function loadMigrations(dir: string = migrationsDir): Migration[] {
  const files = readdirSync(dir).filter((f) => f.endsWith(".sql")).sort();
  let previous = 0;
  return files.map((file) => {
    const m = /^(\d{4})_([a-z0-9_]+)\.sql$/.exec(file);
    if (!m) throw new SlotbrokerError(Code.Internal, `migration file name "${file}" is not NNNN_name.sql`);
    const version = Number(m[1]);
    if (version <= previous) throw new SlotbrokerError(Code.Internal, `migration ${file}: version ${version} is used twice`);
    previous = version;
    const sql = readFileSync(`${dir}/${file}`, "utf8");
    return { version, name: m[2]!, sql, checksum: createHash("sha256").update(sql).digest("hex") };
  });
}

/**
 * Applies pending migrations to the database behind `db` (a pool or a connection string).
 * Safe to run concurrently from many processes; idempotent.
 */
export async function migrate(
  db: pg.Pool | string,
  options: { logger?: Logger; migrations?: readonly Migration[] } = {},
): Promise<MigrationReport> {
  const log = (options.logger ?? silentLogger).child({ component: "migrate" });
  const migrations = options.migrations ?? loadMigrations();
  const own = typeof db === "string" ? new pg.Client({ connectionString: db }) : undefined;
  own?.on("error", () => undefined); // a dropped connection fails the query in flight; never crash
  let client: pg.ClientBase;
  // A pooled connection goes back to the pool only if its advisory lock was released;
  // otherwise it is destroyed, which drops the session lock with it.
  let releasePooled: ((destroy: boolean) => void) | undefined;
  try {
    if (own) {
      await own.connect();
      client = own;
    } else {
      const pooled = await (db as pg.Pool).connect();
      // Checked out, it has no 'error' listener of the pool's: a server restart mid-migration
      // must fail the migration, not crash the process.
      const ignore = (): void => undefined;
      pooled.on("error", ignore);
      client = pooled;
      releasePooled = (destroy) => {
        pooled.off("error", ignore);
        pooled.release(destroy);
      };
    }
  } catch (err) {
    await own?.end().catch(() => undefined);
    throw fromPgError(err, "migrate: connect");
  }
  let unlocked = false;
  try {
    await client.query(lock, [lockKey]);
    try {
      return await applyPending(client, migrations, log);
    } finally {
      unlocked = await client.query(unlock, [lockKey]).then(
        () => true,
        () => false,
      );
    }
  } catch (err) {
    throw fromPgError(err, "migrate");
  } finally {
    releasePooled?.(!unlocked);
    await own?.end().catch(() => undefined);
  }
}

async function applyPending(client: pg.ClientBase, migrations: readonly Migration[], log: Logger): Promise<MigrationReport> {
  await client.query(createLedger);
  const rows = (await client.query<{ version: number; checksum: string }>(selectLedger)).rows;
  const done = new Map(rows.map((r) => [r.version, r.checksum]));
  const applied: number[] = [];
  for (const m of migrations) {
    const recorded = done.get(m.version);
    if (recorded !== undefined) {
      if (recorded !== m.checksum) log.warn({ version: m.version, migration: m.name }, "an applied migration file was changed since; not re-applied");
      continue;
    }
    await client.query("BEGIN");
    try {
      await client.query(m.sql);
      await client.query(insertLedger, [m.version, m.name, m.checksum]);
      await client.query("COMMIT");
    } catch (err) {
      await client.query("ROLLBACK").catch(() => undefined);
      throw fromPgError(err, `migration ${String(m.version).padStart(4, "0")}_${m.name}`);
    }
    log.info({ version: m.version, migration: m.name }, "applied migration");
    applied.push(m.version);
  }
  const known = Math.max(0, ...migrations.map((m) => m.version));
  const newest = Math.max(known, ...rows.map((r) => r.version));
  if (newest > known) log.warn({ schema: newest, known }, "the database schema is newer than this slotbroker; continuing");
  return { applied, version: newest };
}
