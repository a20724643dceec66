import { spawn, type ChildProcess } from "node:child_process";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import * as grpc from "@grpc/grpc-js";
import { stringify } from "yaml";
import { BrokerService, type GetStatusResponse } from "../gen/slotbroker/v1/broker_pb.js";
import type { ExecserverConfigInput } from "../src/execserver/index.js";
import { grpcClientConstructor } from "../src/shared/grpc.js";
import { release, track } from "./resources.js";
import { waitForOutput } from "./child-output.js";
import { withFreePorts } from "../src/shared/free-port.js";
import { projectRoot, slotbrokerArgs } from "./node-children.js";

const StatusClient = grpcClientConstructor(BrokerService);

/** An execserver running as a child process (`slotbroker execserver --config FILE`). */
export interface ExecserverProcess {
  readonly instanceId: string;
  /** "127.0.0.1:PORT" of the gRPC listener; stays the same across restart(). */
  readonly grpcAddress: string;
  readonly adminAddress: string;
  /** "127.0.0.1:PORT" of the legacy token protocol, when the config turns it on (as of the last start). */
  readonly legacyAddress: string | undefined;
  readonly configPath: string;
  readonly child: ChildProcess;
  /** Everything the process wrote to stderr (logs), for failure messages. */
  stderr(): string;
  /** GetStatus over gRPC. */
  status(): Promise<GetStatusResponse>;
  /** Kills the process (SIGKILL by default: a crash) and waits for it to exit. */
  kill(signal?: NodeJS.Signals): Promise<void>;
  /**
   * Sends `signal` to the process's whole process group (`kill -- -PGID`, as a shell or
   * supervisord's `killasgroup` does) and waits for the execserver to exit. Needs `ownGroup`.
   */
  killGroup(signal?: NodeJS.Signals): Promise<void>;
  /** Kills and starts it again on the same ports with the same config (or `config`, same ports). */
  restart(signal?: NodeJS.Signals, config?: SpawnExecserverConfig): Promise<void>;
}

/** The config of a spawned execserver; listen addresses default to free loopback ports below the ephemeral range. */
export type SpawnExecserverConfig = Omit<ExecserverConfigInput, "listen" | "adminListen"> & { listen?: string; adminListen?: string };

/** Starts an execserver child process; `config` is written to a YAML file in a temp dir. */
export async function spawnExecserver(
  config: SpawnExecserverConfig,
  options: {
    name?: string;
    startTimeoutMs?: number;
    logLevel?: string;
    /** Started as the leader of a process group (and session) of its own, as a shell or supervisor would. */
    ownGroup?: boolean;
    /** Added to the environment (e.g. TMPDIR: where its jobs' directories go). */
    env?: NodeJS.ProcessEnv;
  } = {},
): Promise<ExecserverProcess> {
  const dir = mkdtempSync(join(tmpdir(), "slotbroker-exec-"));
  let listen = config.listen ?? "";
  let adminListen = config.adminListen ?? "";
  const configPath = join(dir, "execserver.yaml");
  let child: ChildProcess;
  let log = "";
  let instanceId = "";
  let grpcAddress = "";
  let adminAddress = "";
  let legacyAddress: string | undefined;

  const start = async (): Promise<void> => {
    child = spawn(process.execPath, slotbrokerArgs(["execserver", "--config", configPath]), {
      cwd: projectRoot,
      stdio: ["ignore", "pipe", "pipe"],
      env: { ...process.env, SLOTBROKER_LOG_LEVEL: options.logLevel ?? process.env.SLOTBROKER_EXEC_LOG_LEVEL ?? "warn", ...options.env },
      detached: options.ownGroup ?? false,
    });
    child.stderr!.setEncoding("utf8").on("data", (chunk: string) => {
      log = (log + chunk).slice(-20_000);
    });
    const banner = await waitForOutput(child, /^execserver (\S+) listening (.+)$/m, { timeoutMs: options.startTimeoutMs ?? 30_000, context: () => log });
    instanceId = banner[1]!;
    const bound = parseBanner(banner[2]!);
    legacyAddress = bound.legacy;
    // Legacy-only, "listen" serves the token protocol: that is the address to dial.
    grpcAddress = bound.grpc ?? bound.legacy!;
    adminAddress = bound.admin;
  };
  // Default ports come from freePort (outside the ephemeral range), so restart() finds them free.
  await withFreePorts(2, async ([grpcPort, adminPort]) => {
    listen = config.listen ?? `127.0.0.1:${grpcPort}`;
    adminListen = config.adminListen ?? `127.0.0.1:${adminPort}`;
    writeFileSync(configPath, stringify({ ...config, listen, adminListen }));
    await start();
  });
  const name = options.name ?? `execserver ${config.instanceId ?? listen}`;
  // A restart binds the same ports again (its clients are aimed at the address); a port
  // the caller gave as 0 came from the kernel and may be taken while the process is down.
  listen = withPort(listen, grpcAddress);
  adminListen = withPort(adminListen, adminAddress);
  writeFileSync(configPath, stringify({ ...config, listen, adminListen }));

  const kill = async (signal: NodeJS.Signals = "SIGKILL"): Promise<void> => {
    const c = child;
    if (c.exitCode !== null || c.signalCode !== null) return;
    const exited = new Promise<void>((done) => c.once("exit", () => done()));
    c.kill(signal);
    await exited;
  };

  const killGroup = async (signal: NodeJS.Signals = "SIGKILL"): Promise<void> => {
    const c = child;
    if (!options.ownGroup) throw new Error("killGroup() needs an execserver spawned with ownGroup");
    if (c.exitCode !== null || c.signalCode !== null) return;
    const exited = new Promise<void>((done) => c.once("exit", () => done()));
    process.kill(-c.pid!, signal);
    await exited;
  };

  const handle: ExecserverProcess = {
    get instanceId() {
      return instanceId;
    },
    get grpcAddress() {
      return grpcAddress;
    },
    get adminAddress() {
      return adminAddress;
    },
    get legacyAddress() {
      return legacyAddress;
    },
    configPath,
    get child() {
      return child;
    },
    stderr: () => log,
    status: () => getStatus(grpcAddress, config.token),
    kill,
    killGroup,
    restart: async (signal, next) => {
      await kill(signal);
      if (next) writeFileSync(configPath, stringify({ ...next, listen, adminListen }));
      await start();
    },
  };
  return track(handle, name, async () => {
    await kill("SIGKILL");
    rmSync(dir, { recursive: true, force: true });
  });
}

/** The addresses of an execserver's banner ("grpc=… admin=… [legacy=…]" or "legacy=… admin=…"). */
function parseBanner(where: string): { grpc?: string; admin: string; legacy?: string } {
  const field = (key: string): string | undefined => new RegExp(`\\b${key}=(\\S+)`).exec(where)?.[1];
  const admin = field("admin");
  if (!admin || (!field("grpc") && !field("legacy"))) throw new Error(`unexpected execserver banner: ${where}`);
  return { grpc: field("grpc"), admin, legacy: field("legacy") };
}

// "host:port" of a listen setting with the port the process actually bound.
function withPort(listen: string, bound: string): string {
  return `${listen.slice(0, listen.lastIndexOf(":"))}:${bound.slice(bound.lastIndexOf(":") + 1)}`;
}

/** Stops a spawned execserver (tracked resources are released). */
export function stopExecserver(process: ExecserverProcess | undefined): Promise<void> {
  return release(process);
}

/** One GetStatus call to an execserver. */
export async function getStatus(address: string, token?: string): Promise<GetStatusResponse> {
  const client = new StatusClient(address, grpc.credentials.createInsecure());
  try {
    const metadata = new grpc.Metadata();
    if (token) metadata.set("authorization", `Bearer ${token}`);
    return await new Promise<GetStatusResponse>((resolvePromise, reject) =>
      (client as unknown as {
        getStatus: (r: object, md: grpc.Metadata, cb: (e: Error | null, r: GetStatusResponse) => void) => void;
      }).getStatus({}, metadata, (err, res) => (err ? reject(err) : resolvePromise(res))),
    );
  } finally {
    client.close();
  }
}

/**
 * Polls `check` until it returns a truthy value (bounded); returns that value. Only for a
 * state another process holds and tells only when asked (an execserver's GetStatus, a
 * fylr's Stats); a state of this process is awaited through its events (event-monitor.ts).
 */
export async function waitFor<T>(what: string, check: () => T | Promise<T>, timeoutMs = 15_000, everyMs = 25): Promise<NonNullable<T>> {
  const deadline = Date.now() + timeoutMs;
  let last: unknown;
  for (;;) {
    try {
      const value = await check();
      if (value) return value;
    } catch (err) {
      last = err;
    }
    if (Date.now() > deadline) {
      throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}${last ? `: ${(last as Error).message}` : ""}`);
    }
    await new Promise((r) => setTimeout(r, everyMs));
  }
}
