import { spawn } from "node:child_process";
import { parseArgs } from "node:util";
import { checkPortsFree, removeUpState, stackDataDir, startLocalStack, upStateFile, writeUpState, type LocalStack, type LocalStackPorts } from "../app/index.js";
import { SlotbrokerError } from "../shared/errors.js";
import { createLogger, type Logger } from "../shared/log.js";
import { onWrapperGone } from "./serve.js";

const help = `usage: slotbroker up [options]

Runs the whole stack locally in one process tree: Postgres (embedded unless DATABASE_URL
is set; its data persists between runs), one execserver with demo services (cat,
sha256sum, wc, sleep, gzip, base64, … whichever this machine has, plus the builtin noop)
and one fylr connected to it. Prints where everything listens, and writes it to
SLOTBROKER_STATE_FILE (default ~/.local/state/slotbroker/up.json), where "slotbroker
status" and "slotbroker submit" find the stack without --api.

options:
  --port-base N        execserver gRPC N, admin N+1, Postgres N+2, fylr N+100 (default 7600;
                       0 picks free ports for all)
  --exec-port N        execserver gRPC port
  --admin-port N       execserver admin port (/status.json, /metrics)
  --fylr-port N        fylr port (QueueService, pipes, /status.json, /metrics)
  --pg-port N          embedded Postgres port
  --host HOST          listen address (default 127.0.0.1)
  --data-dir DIR       embedded Postgres data (default SLOTBROKER_DATA_DIR or .data/postgres)
  --database-url URL   use this database instead of the embedded one (default DATABASE_URL)
  -h, --help           this text

Ctrl-C or SIGTERM stops everything gracefully (the fylr finishes or gives back its items,
the execserver drains, Postgres stops); a second signal stops at once. The stack runs in a
child process of its own session, so a terminal's Ctrl-C reaches Postgres only through
this orderly shutdown, never before the fylr is done with the database.`;

// Set in the supervised child: it runs the stack; the parent only relays signals.
const supervisedEnv = "SLOTBROKER_UP_SUPERVISED";

interface UpArgs {
  readonly ports: LocalStackPorts;
  readonly host: string;
  readonly dataDir: string | undefined;
  readonly databaseUrl: string | undefined;
}

/** `slotbroker up`: runs until SIGTERM/SIGINT; resolves with the exit code. */
export async function run(argv: string[]): Promise<number> {
  let args: UpArgs | undefined;
  try {
    args = parseUpArgs(argv);
  } catch (err) {
    process.stderr.write(`slotbroker up: ${(err as Error).message}\n\n${help}\n`);
    return 2;
  }
  if (!args) {
    process.stdout.write(`${help}\n`);
    return 0;
  }
  if (process.env[supervisedEnv] !== "1") return supervise(argv);
  const stopper = new Stopper();
  try {
    return await runStack(args, stopper);
  } finally {
    stopper.dispose();
    // The IPC channel to the supervising parent would keep this process alive.
    if (process.connected) process.disconnect();
  }
}

async function runStack(args: UpArgs, stopper: Stopper): Promise<number> {
  // Quiet by default: the banner is what a person reads; SLOTBROKER_LOG_LEVEL=info for more.
  const logger = createLogger({ level: process.env.SLOTBROKER_LOG_LEVEL ?? "warn" });
  stopper.logger = logger;
  let stack: LocalStack;
  try {
    const { host, ports } = args;
    await checkPortsFree(
      [
        { what: "execserver gRPC", host, port: ports.execserver },
        { what: "execserver admin", host, port: ports.admin },
        { what: "fylr", host, port: ports.fylr },
        ...(args.databaseUrl ? [] : [{ what: "embedded Postgres", host: "127.0.0.1", port: ports.postgres }]),
      ],
      "stop whatever uses it, or pick other ports with --port-base N (or --exec-port, --admin-port, --fylr-port, --pg-port)",
    );
    const dataDir = args.dataDir ?? (await stackDataDir());
    if (!args.databaseUrl) process.stderr.write(`slotbroker up: starting Postgres (data in ${dataDir}) …\n`);
    stack = await startLocalStack({ host, ports, databaseUrl: args.databaseUrl, dataDir, logger });
  } catch (err) {
    process.stderr.write(`slotbroker up: ${SlotbrokerError.from(err).message}\n`);
    logger.flush();
    return 1;
  }
  const stateFile = upStateFile();
  try {
    writeUpState({ pid: process.pid, api: stack.fylr.url, execserver: stack.execserver.grpcAddress, admin: stack.execserver.adminUrl, startedAt: new Date().toISOString() }, stateFile);
  } catch (err) {
    process.stderr.write(`slotbroker up: cannot write ${stateFile} (status and submit will need --api): ${(err as Error).message}\n`);
  }
  if (!stopper.requested) process.stdout.write(banner(stack, args.databaseUrl !== undefined, stateFile));
  const code = await stopper.until(stack);
  removeUpState(process.pid, stateFile);
  process.stdout.write("slotbroker up: stopped\n");
  logger.flush();
  return code;
}

/** undefined for --help. */
function parseUpArgs(argv: string[]): UpArgs | undefined {
  const { values } = parseArgs({
    args: argv,
    options: {
      "port-base": { type: "string" },
      "exec-port": { type: "string" },
      "admin-port": { type: "string" },
      "fylr-port": { type: "string" },
      "pg-port": { type: "string" },
      host: { type: "string" },
      "data-dir": { type: "string" },
      "database-url": { type: "string" },
      help: { type: "boolean", short: "h" },
    },
    strict: true,
  });
  if (values.help) return undefined;
  const base = port("--port-base", values["port-base"]) ?? 7600;
  const offset = (n: number): number => (base === 0 ? 0 : base + n);
  const ports: LocalStackPorts = {
    execserver: port("--exec-port", values["exec-port"]) ?? offset(0),
    admin: port("--admin-port", values["admin-port"]) ?? offset(1),
    postgres: port("--pg-port", values["pg-port"]) ?? offset(2),
    fylr: port("--fylr-port", values["fylr-port"]) ?? offset(100),
  };
  for (const [name, p] of Object.entries(ports)) if (p > 65535) throw new Error(`--port-base ${base}: the ${name} port ${p} is above 65535`);
  return {
    ports,
    host: values.host ?? "127.0.0.1",
    dataDir: values["data-dir"],
    databaseUrl: values["database-url"] ?? (process.env.DATABASE_URL || undefined),
  };
}

function port(flag: string, text: string | undefined): number | undefined {
  if (text === undefined) return undefined;
  const n = Number(text);
  if (!/^\d+$/.test(text) || n > 65535) throw new Error(`${flag}: expected a port number 0…65535, got "${text}"`);
  return n;
}

function banner(stack: LocalStack, userDatabase: boolean, stateFile: string): string {
  const api = stack.fylr.url;
  const db = userDatabase ? maskPassword(stack.databaseUrl) : stack.databaseUrl;
  const where = stack.postgres ? `embedded, data in ${stack.postgres.dataDir}` : "DATABASE_URL";
  const sample = Buffer.from("hello\n").toString("base64");
  return [
    "slotbroker up: the local stack is running",
    "",
    `  postgres    ${db}  (${where})`,
    `  execserver  grpc=${stack.execserver.grpcAddress}  admin=${stack.execserver.adminUrl}  (/status.json, /metrics)`,
    `              services: ${stack.services.join(", ")}`,
    `  fylr        api=${api}  (QueueService, pipes, /status.json, /metrics)  id=${stack.fylr.id}`,
    "",
    `slotbroker status and submit find this stack through ${stateFile};`,
    `from another user or machine: export SLOTBROKER_API=${api}  (or --api ${api})`,
    "",
    "try:",
    "  echo hello > /tmp/hello.txt",
    "  npx slotbroker submit --service sha256sum --stdin /tmp/hello.txt --wait",
    "  npx slotbroker status",
    `  curl -s -X POST -H 'Content-Type: application/json' -d '{"calls":[{"service":"sha256sum","stdinData":"${sample}"}]}' \\`,
    `    ${api}/slotbroker.v1.QueueService/Submit`,
    "",
    "Ctrl-C (or SIGTERM) stops everything; a second Ctrl-C stops at once.",
    "",
  ].join("\n");
}

function maskPassword(url: string): string {
  try {
    const u = new URL(url);
    if (u.password) u.password = "***";
    return u.toString();
  } catch {
    return "(unparsable URL)";
  }
}

/**
 * Runs the stack in a child process that leads a session of its own, and relays signals.
 * A terminal's Ctrl-C goes to its whole foreground process group: without this, the
 * embedded Postgres (a child of the stack) would shut down at the same moment as the fylr
 * that still needs it to finish or give back its items. Resolves with the child's exit code.
 */
function supervise(argv: string[]): Promise<number> {
  const child = spawn(process.execPath, [...process.execArgv, process.argv[1]!, "up", ...argv], {
    detached: true,
    stdio: ["ignore", "inherit", "inherit", "ipc"],
    env: { ...process.env, [supervisedEnv]: "1" },
  });
  let relayed = 0;
  const relay = (): void => {
    relayed++;
    child.kill("SIGTERM");
  };
  const signals: NodeJS.Signals[] = ["SIGINT", "SIGTERM", "SIGHUP"];
  for (const signal of signals) process.on(signal, relay);
  const stopWatching = onWrapperGone(() => {
    if (relayed === 0) relay();
  });
  return new Promise((resolve) => {
    child.once("error", (err) => {
      process.stderr.write(`slotbroker up: cannot start the stack: ${err.message}\n`);
      resolve(1);
    });
    child.once("exit", (code, signal) => {
      for (const s of signals) process.off(s, relay);
      stopWatching();
      resolve(code ?? (signal ? 1 : 0));
    });
  });
}

/**
 * Signals for the stack: the first stops it gracefully, the second at once. Installed before
 * the stack starts, so a signal during start-up stops it as soon as it is up instead of
 * killing this process under a running Postgres. The supervising parent going away (the
 * IPC channel closes) counts as a signal too.
 */
class Stopper {
  logger: Logger | undefined;
  private signals = 0;
  private stack: LocalStack | undefined;
  private wake: (() => void) | undefined;
  private readonly first = new Promise<void>((resolve) => (this.wake = resolve));
  private readonly onSignal = (signal: NodeJS.Signals | "disconnect"): void => {
    this.signals++;
    this.logger?.info({ signal }, this.signals === 1 ? "stopping the local stack" : "stopping the local stack now");
    if (this.signals === 1) process.stderr.write("slotbroker up: stopping (again to stop at once) …\n");
    this.wake?.();
    if (this.signals >= 2) void this.stack?.forceClose().catch(() => undefined);
  };
  private readonly onTerm = (): void => this.onSignal("SIGTERM");
  private readonly onInt = (): void => this.onSignal("SIGINT");
  private readonly onDisconnect = (): void => this.onSignal("disconnect");

  constructor() {
    process.on("SIGTERM", this.onTerm);
    process.on("SIGINT", this.onInt);
    process.on("disconnect", this.onDisconnect);
  }

  /** True once a signal arrived. */
  get requested(): boolean {
    return this.signals > 0;
  }

  /** Waits for the first signal and stops the stack; resolves with 0, or 1 when stopping failed. */
  async until(stack: LocalStack): Promise<number> {
    this.stack = stack;
    await this.first;
    if (this.signals >= 2) void stack.forceClose().catch(() => undefined);
    try {
      await stack.close();
      return 0;
    } catch (err) {
      this.logger?.error({ err }, "stopping failed");
      return 1;
    }
  }

  /** Removes the handlers. */
  dispose(): void {
    process.off("SIGTERM", this.onTerm);
    process.off("SIGINT", this.onInt);
    process.off("disconnect", this.onDisconnect);
  }
}
