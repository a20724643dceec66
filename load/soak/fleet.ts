// The soak's fleet on loopback: one restartable Postgres, execservers (two behind HAProxy),
// fylrs, and a chaos proxy in front of every broker address the fylrs dial. Every process
// keeps its ports across restarts and carries the run marker for the final /proc sweep.
import { spawn, type ChildProcess } from "node:child_process";
import { appendFileSync, chmodSync, mkdirSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { stringify } from "yaml";
import { startEmbeddedPostgres, type LocalPostgres } from "../../src/shared/embedded-postgres.js";
import { freePort } from "../../src/shared/free-port.js";
import { createDatabase } from "../../harness/databases.js";
import { waitForOutput } from "../../harness/child-output.js";
import { ChaosProxy } from "../../harness/chaos-proxy.js";
import { startHaproxy, type Haproxy } from "../../harness/haproxy.js";
import { release } from "../../harness/resources.js";
import { RUN_MARKER } from "../processes.js";
import { nodeScript } from "../../harness/node-children.js";

/** A server process that can be killed, frozen and started again on the same ports. */
export class ServerProcess {
  private child: ChildProcess | undefined;
  private log = "";
  /** Start-up banner's match of the current incarnation. */
  banner: RegExpExecArray | undefined;
  /** Times this process was started. */
  starts = 0;
  /** The pid of every incarnation, in order. */
  readonly pids: number[] = [];
  /** pid → when it died (ms since epoch), for every incarnation that is gone. */
  readonly deaths = new Map<number, number>();
  /** Exits nobody asked for (a crash): when, which pid, and the log's tail. */
  readonly crashes: { at: number; pid: number; how: string; tail: string }[] = [];
  private expectingExit = false;

  constructor(
    readonly name: string,
    private readonly args: string[],
    private readonly bannerPattern: RegExp,
    private readonly options: { cwd: string; env: NodeJS.ProcessEnv; logFile?: string },
  ) {}

  get pid(): number | undefined {
    return this.alive ? this.child?.pid : undefined;
  }

  get alive(): boolean {
    return !!this.child && this.child.exitCode === null && this.child.signalCode === null;
  }

  stderr(): string {
    return this.log;
  }

  async start(): Promise<void> {
    const child = spawn(process.execPath, this.args, { cwd: this.options.cwd, env: { ...process.env, ...this.options.env }, stdio: ["ignore", "pipe", "pipe"] });
    this.child = child;
    this.starts += 1;
    if (child.pid) this.pids.push(child.pid);
    const logFile = this.options.logFile;
    child.stderr.setEncoding("utf8").on("data", (chunk: string) => {
      this.log = (this.log + chunk).slice(-50_000);
      if (logFile) appendFileSync(logFile, chunk);
    });
    this.expectingExit = false;
    child.once("exit", (code, signal) => {
      this.deaths.set(child.pid!, Date.now());
      if (!this.expectingExit) this.crashes.push({ at: Date.now(), pid: child.pid!, how: signal ?? `exit ${code}`, tail: this.log.slice(-3_000) });
    });
    this.banner = await waitForOutput(child, this.bannerPattern, { timeoutMs: 60_000, context: () => this.log });
  }

  signal(signal: NodeJS.Signals): void {
    if (this.alive) this.child!.kill(signal);
  }

  /** Sends `signal` (SIGKILL: a crash) and waits for the exit. */
  async kill(signal: NodeJS.Signals = "SIGKILL"): Promise<void> {
    const child = this.child;
    if (!child || !this.alive) return;
    const exited = new Promise<void>((done) => child.once("exit", () => done()));
    this.expectingExit = true;
    child.kill("SIGCONT");
    child.kill(signal);
    const timer = setTimeout(() => child.kill("SIGKILL"), 10_000);
    await exited;
    clearTimeout(timer);
  }
}

export interface FleetOptions {
  readonly root: string;
  readonly dir: string;
  readonly runId: string;
  readonly jobScript: string;
  readonly execservers: number;
  readonly fylrs: number;
  readonly slotsPerExecserver: number;
  readonly logLevel: string;
}

/** Everything the soak started; stop() takes it all down. */
export interface Fleet {
  readonly databaseUrl: string;
  readonly execservers: ServerProcess[];
  /** gRPC address of each execserver (index as `execservers`). */
  readonly execAddresses: string[];
  readonly fylrs: ServerProcess[];
  /** The chaos proxy ("proxy-I", index as `proxies`) each execserver's streams go through. */
  readonly execProxies: string[];
  /** Each execserver's whole log (JSON lines, every incarnation), index as `execservers`. */
  readonly execLogs: string[];
  /** "http://127.0.0.1:PORT" of each fylr. */
  readonly fylrUrls: string[];
  /** The execservers' TMPDIR (shared, as on one host): their jobs' directories go there. */
  readonly execTmp: string;
  readonly proxies: ChaosProxy[];
  readonly haproxy: Haproxy;
  restartPostgres(downMs: number): Promise<void>;
  stop(): Promise<void>;
}

/** Starts the fleet: Postgres, execservers, HAProxy over the first two, proxies, fylrs. */
export async function startFleet(o: FleetOptions): Promise<Fleet> {
  const env = { [RUN_MARKER]: o.runId, SLOTBROKER_LOG_LEVEL: o.logLevel };
  const cli = join(o.root, "src", "cli.ts");
  let pg: LocalPostgres | undefined;
  let adminUrl = process.env.DATABASE_URL;
  const pgDir = join(o.dir, "pg");
  mkdirSync(pgDir, { recursive: true });
  chmodSync(pgDir, 0o755); // as root the server runs as the "postgres" user
  // Postgres starts while the execservers, HAProxy and the proxies do: only fylrs need it.
  const database = (async () => {
    if (!adminUrl) {
      pg = await startEmbeddedPostgres({ dataDir: join(pgDir, "data"), persistent: true });
      adminUrl = pg.url;
    }
    return (await createDatabase(adminUrl, "soak")).url;
  })();
  // Not awaited until the fylrs start; a failure then still fails the start.
  database.catch(() => undefined);

  const execservers: ServerProcess[] = [];
  const execLogs: string[] = [];
  const execTmp = join(o.dir, "exec-tmp");
  mkdirSync(execTmp);
  const writeExecConfig = (i: number, listen: string): void =>
    writeFileSync(
      join(o.dir, `exec-${i}.yaml`),
      stringify({
        instanceId: `soak-exec-${i}`,
        listen,
        adminListen: "127.0.0.1:0",
        drainTimeout: "2s",
        offerTimeout: "3s",
        waitgroups: { work: { processes: o.slotsPerExecserver } },
        services: { soak: { waitgroup: "work", command: ["sh", o.jobScript], timeout: "20s" } },
      }),
    );
  for (let i = 0; i < o.execservers; i++) {
    // At info an execserver logs how every job it stopped or saw killed ended (pid, signal,
    // reason): the checker's record of executions that died without writing their end.
    const logFile = join(o.dir, `execserver-${i}.log`);
    const execEnv = { ...env, SLOTBROKER_LOG_LEVEL: moreVerbose(o.logLevel, "info"), TMPDIR: execTmp };
    const path = join(o.dir, `exec-${i}.yaml`);
    execservers.push(new ServerProcess(`execserver-${i}`, [...nodeScript(cli), "execserver", "--config", path], /^execserver (\S+) listening (.+)$/m, { cwd: o.root, env: execEnv, logFile }));
    execLogs.push(logFile);
  }
  const execAddresses = await Promise.all(execservers.map((e, i) => firstStart(e, (listen) => writeExecConfig(i, listen))));
  // Two (or more) behind HAProxy, the last one direct; every path through a chaos proxy.
  const balanced = execAddresses.slice(0, Math.max(2, o.execservers - 1));
  const direct = execAddresses.slice(balanced.length);
  const haproxy = await startHaproxy(balanced);
  const proxies = await Promise.all([haproxy.address, ...direct].map((a) => ChaosProxy.start(a)));
  const execProxies = execAddresses.map((_, i) => `proxy-${Math.max(0, i - balanced.length + 1)}`);

  const databaseUrl = await database;
  const fylrs: ServerProcess[] = [];
  const writeFylrConfig = (i: number, listen: string): void =>
    writeFileSync(
      join(o.dir, `fylr-${i}.yaml`),
      stringify({
        name: `soak-fylr-${i}`,
        listen,
        databaseUrl,
        databasePoolSize: 6,
        execserver: {
          addresses: proxies.map((p) => p.address),
          connectTimeout: "10s",
          retryTick: "300ms",
          growInterval: "500ms",
          reconnectInitial: "100ms",
          reconnectMax: "1s",
          pingInterval: "1s",
          pingTimeout: "2s",
        },
        dispatcher: {
          pollInterval: "500ms",
          heartbeatInterval: "500ms",
          staleAfter: "4s",
          noSlotDelay: "1s",
          retryInitial: "200ms",
          retryMax: "2s",
          stopGrace: "2s",
        },
      }),
    );
  for (let i = 0; i < o.fylrs; i++) {
    const path = join(o.dir, `fylr-${i}.yaml`);
    fylrs.push(new ServerProcess(`fylr-${i}`, [...nodeScript(cli), "fylr", "--config", path], /^fylr (\S+) listening http=(\S+)$/m, { cwd: o.root, env, logFile: join(o.dir, `fylr-${i}.log`) }));
  }
  // All at once: the migrations' advisory lock lets one fylr migrate while the rest wait.
  const fylrUrls = (await Promise.all(fylrs.map((f, i) => firstStart(f, (listen) => writeFylrConfig(i, listen))))).map((listen) => `http://${listen}`);

  return {
    databaseUrl,
    execservers,
    execAddresses,
    execProxies,
    execLogs,
    fylrs,
    fylrUrls,
    execTmp,
    proxies,
    haproxy,
    async restartPostgres(downMs) {
      if (!pg) return; // DATABASE_URL: not ours to restart
      const port = pg.port;
      await pg.stop();
      await new Promise((r) => setTimeout(r, downMs));
      pg = await startEmbeddedPostgres({ dataDir: join(pgDir, "data"), port, persistent: true });
    },
    async stop() {
      await Promise.all([...fylrs, ...execservers].map((p) => p.kill("SIGTERM")));
      await Promise.all(proxies.map((p) => p.close()));
      await release(haproxy);
      await pg?.stop();
    },
  };
}

const levels = ["trace", "debug", "info", "warn", "error", "fatal", "silent"];

/** The more verbose of two pino levels. */
function moreVerbose(a: string, b: string): string {
  return levels.indexOf(a) !== -1 && levels.indexOf(a) < levels.indexOf(b) ? a : b;
}

/**
 * Starts a server for the first time on a free port ("127.0.0.1:PORT", written into its
 * config by `writeConfig`); restarts keep that port. Picked in advance rather than bound as
 * port 0 because of the restarts: freePort's ports lie outside the kernel's ephemeral range,
 * so no connection of the busy loopback is handed one while its server is down. Another
 * process may still pick the same port before the first listen: then a fresh one, up to three times.
 */
async function firstStart(p: ServerProcess, writeConfig: (listen: string) => void): Promise<string> {
  for (let attempt = 1; ; attempt++) {
    const listen = `127.0.0.1:${await freePort()}`;
    writeConfig(listen);
    try {
      await p.start();
      return listen;
    } catch (err) {
      if (attempt >= 3 || !String((err as Error).message).includes("EADDRINUSE")) throw err;
      p.crashes.pop(); // a port taken from under it, not a crash
    }
  }
}
