/**
 * `slotbroker up` as a library: Postgres (DATABASE_URL, or an embedded server under a data
 * directory that persists between runs), one execserver with the demo services and one
 * fylr connected to it, all in this process tree. Also the ports it is about to take,
 * checked first. The state file that tells `status` and `submit` where a running stack
 * listens is up-state.ts.
 */
import { createServer } from "node:net";
import { compileExecserverConfig } from "../execserver/index.js";
import { CleanupStack } from "../shared/cleanup.js";
import type * as EmbeddedPostgres from "../shared/embedded-postgres.js";
import type { LocalPostgres } from "../shared/embedded-postgres.js";
import { Code, SlotbrokerError } from "../shared/errors.js";
import { silentLogger, type Logger } from "../shared/log.js";
import { demoExecserverConfig } from "./demo-services.js";
import { startExecserver, type ExecserverHandle } from "./execserver.js";
import { startFylr, type FylrHandle } from "./fylr.js";
import { compileFylrConfig } from "./fylr-config.js";

/** Where the local stack listens; 0 picks a free port. */
export interface LocalStackPorts {
  readonly execserver: number;
  readonly admin: number;
  readonly fylr: number;
  /** The embedded Postgres (unused with a database URL). */
  readonly postgres: number;
}

/** Options of startLocalStack. */
export interface LocalStackOptions {
  readonly host: string;
  readonly ports: LocalStackPorts;
  /** An existing database; when unset, an embedded Postgres runs under `dataDir`. */
  readonly databaseUrl?: string;
  readonly dataDir: string;
  readonly logger?: Logger;
}

/** The running stack. */
export interface LocalStack {
  /** Set when this stack runs its own Postgres. */
  readonly postgres: LocalPostgres | undefined;
  readonly databaseUrl: string;
  readonly execserver: ExecserverHandle;
  readonly fylr: FylrHandle;
  /** Services of the demo execserver, sorted. */
  readonly services: readonly string[];
  /** Graceful: the fylr finishes its items, the execserver drains, Postgres stops. Idempotent. */
  close(): Promise<void>;
  /** Forceful: items go back at once, jobs are killed, Postgres stops. Idempotent. */
  forceClose(): Promise<void>;
}

const databaseName = "slotbroker";

/** Starts Postgres (or uses databaseUrl), the demo execserver and a fylr. */
export async function startLocalStack(options: LocalStackOptions): Promise<LocalStack> {
  const logger = options.logger ?? silentLogger;
  const log = logger.child({ component: "up" });
  const started: { postgres?: LocalPostgres; execserver?: ExecserverHandle; fylr?: FylrHandle } = {};
  try {
    let databaseUrl = options.databaseUrl;
    if (!databaseUrl) {
      const { startEmbeddedPostgres } = await loadEmbeddedPostgres();
      log.info({ dataDir: options.dataDir }, "starting the embedded Postgres");
      started.postgres = await startEmbeddedPostgres({ dataDir: options.dataDir, port: options.ports.postgres, logger });
      // The embedded server starts with only "postgres"; the fylr creates the stack's database.
      databaseUrl = started.postgres.urlFor(databaseName);
    }
    const hostPort = (port: number): string => `${options.host.includes(":") ? `[${options.host}]` : options.host}:${port}`;
    const execConfig = compileExecserverConfig(demoExecserverConfig(hostPort(options.ports.execserver), hostPort(options.ports.admin)), "up: execserver");
    started.execserver = await startExecserver(execConfig, { logger });
    const fylrConfig = compileFylrConfig(
      {
        name: "local",
        listen: hostPort(options.ports.fylr),
        databaseUrl,
        execserver: { addresses: [started.execserver.grpcAddress], connectTimeout: "30s" },
        dispatcher: { stopGrace: "10s" },
        // The embedded server's disk is this host's: uploads keep store.minFreeSpace free there.
        ...(started.postgres ? { store: { diskPath: started.postgres.dataDir } } : {}),
      },
      "up: fylr",
    );
    started.fylr = await startFylr(fylrConfig, { logger });
    return assemble(started.postgres, databaseUrl, started.execserver, started.fylr, Object.keys(execConfig.services).sort(), log);
  } catch (err) {
    await started.fylr?.forceClose().catch(() => undefined);
    await started.execserver?.forceClose().catch(() => undefined);
    await started.postgres?.stop().catch(() => undefined);
    throw err;
  }
}

function assemble(
  postgres: LocalPostgres | undefined,
  databaseUrl: string,
  execserver: ExecserverHandle,
  fylr: FylrHandle,
  services: readonly string[],
  log: Logger,
): LocalStack {
  let closing: Promise<void> | undefined;
  let forcing: Promise<void> | undefined;
  // The fylr goes first (its items need the execserver), Postgres last (everyone needs it).
  // Every part is stopped even when one fails; the error names each one that did.
  const shutdown = async (force: boolean): Promise<void> => {
    const stack = new CleanupStack("local stack");
    if (postgres) {
      stack.defer("postgres", () => postgres.stop());
    }
    stack.defer("execserver", () => (force ? execserver.forceClose() : execserver.close()));
    stack.defer("fylr", () => (force ? fylr.forceClose() : fylr.close()));
    try {
      await stack.run();
    } catch (err) {
      log.warn({ err }, "part of the stack did not stop cleanly");
      throw err;
    }
  };
  return {
    postgres,
    databaseUrl,
    execserver,
    fylr,
    services,
    close: () => (closing ??= shutdown(false)),
    forceClose: () => (forcing ??= shutdown(true)),
  };
}

/** Where the embedded Postgres keeps its data: SLOTBROKER_DATA_DIR, else the project default. */
export async function stackDataDir(env: NodeJS.ProcessEnv = process.env): Promise<string> {
  if (env.SLOTBROKER_DATA_DIR) return env.SLOTBROKER_DATA_DIR;
  return (await loadEmbeddedPostgres()).defaultDataDir();
}

// Loaded only when needed: execservers and fylrs never touch the embedded server.
function loadEmbeddedPostgres(): Promise<typeof EmbeddedPostgres> {
  return import("../shared/embedded-postgres.js");
}

// --- its ports -----------------------------------------------------------------------
//
// Checking listen ports before starting, so a taken port gets an error that names it.

/** One port to check: what listens there, for the error message. */
export interface PortClaim {
  readonly what: string;
  readonly host: string;
  /** 0 picks a free port and is never taken. */
  readonly port: number;
}

/** Throws FAILED_PRECONDITION naming the first claim whose port is in use. */
export async function checkPortsFree(claims: readonly PortClaim[], hint: string): Promise<void> {
  for (const claim of claims) {
    if (claim.port === 0) continue;
    const err = await tryListen(claim.host, claim.port);
    if (!err) continue;
    const why = err.code === "EADDRINUSE" ? "is already in use" : `cannot be bound (${err.code ?? err.message})`;
    throw new SlotbrokerError(Code.FailedPrecondition, `port ${claim.port} on ${claim.host} (${claim.what}) ${why}; ${hint}`);
  }
}

function tryListen(host: string, port: number): Promise<NodeJS.ErrnoException | undefined> {
  return new Promise((resolve) => {
    const server = createServer();
    server.once("error", (err: NodeJS.ErrnoException) => resolve(err));
    server.listen({ host, port, exclusive: true }, () => server.close(() => resolve(undefined)));
  });
}

// --- where a running stack listens ---------------------------------------------------
//
// Where a running `slotbroker up` listens, in a small per-user file, so that `status` and
// `submit` find a stack started with `--port-base 0` (or any other ports) without flags.
