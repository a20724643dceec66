import { spawn, type ChildProcess } from "node:child_process";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { connect } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { withFreePorts } from "../src/shared/free-port.js";
import { release, track } from "./resources.js";
import { requireTool, systemTools } from "./system-tools.js";

/** The HAProxy binary from Debian's package. */
export const HAPROXY = systemTools.haproxy.path;

/** A TCP load balancer in front of some backends, running in the foreground. */
export interface Haproxy {
  /** "127.0.0.1:PORT" to dial. */
  readonly address: string;
  readonly child: ChildProcess;
  /** What HAProxy wrote (warnings, alerts). */
  output(): string;
}

/**
 * Starts HAProxy (`mode tcp`, `balance roundrobin`) on a free loopback port in front of
 * `backends` ("host:port").
 */
export async function startHaproxy(backends: readonly string[]): Promise<Haproxy> {
  const started = await startHaproxyFrontends({ broker: backends });
  // The same (tracked) object: release() of the returned handle stops HAProxy.
  return Object.assign(started, { address: started.addresses.broker! });
}

/** HAProxy with several TCP frontends, each round-robin over its own backends. */
export interface HaproxyFrontends {
  /** Frontend name → "127.0.0.1:PORT" to dial. */
  readonly addresses: Readonly<Record<string, string>>;
  readonly child: ChildProcess;
  output(): string;
}

/**
 * One HAProxy process (`mode tcp`, `balance roundrobin`, like startHaproxy) with a frontend
 * per entry of `frontends` (name → backends), e.g. the gRPC ports and the legacy HTTP ports
 * of the same execservers behind the same balancer.
 */
export async function startHaproxyFrontends(frontends: Readonly<Record<string, readonly string[]>>): Promise<HaproxyFrontends> {
  const entries = Object.entries(frontends);
  // HAProxy cannot bind port 0, so the ports are picked first; one taken before HAProxy
  // bound it makes HAProxy exit with "Address already in use": then fresh ones.
  return withFreePorts(entries.length, async (ports) => {
    const config = [
      "global",
      "  maxconn 4096",
      "defaults",
      "  mode tcp",
      "  timeout connect 2s",
      // Broker streams are long-lived; gRPC keepalive keeps them busy far below this.
      "  timeout client 1h",
      "  timeout server 1h",
      // Like a Kubernetes Service routing only to ready pods: TCP health checks take a dead
      // backend out of the rotation, and a failed connect is retried on another one.
      "  option redispatch",
      "  retries 2",
      "  default-server check inter 200ms fall 2 rise 1",
      ...entries.flatMap(([name, backends], i) => [
        `frontend ${name}`,
        `  bind 127.0.0.1:${ports[i]}`,
        `  default_backend ${name}_backends`,
        `backend ${name}_backends`,
        "  balance roundrobin",
        ...backends.map((backend, j) => `  server ${name}${j + 1} ${backend}`),
      ]),
      "",
    ].join("\n");
    const addresses = Object.fromEntries(entries.map(([name], i) => [name, `127.0.0.1:${ports[i]}`]));
    return runHaproxy(config, addresses, ports);
  });
}

// Runs HAProxy with `config` until every port accepts; rejects (and cleans up) when it exits first.
async function runHaproxy(config: string, addresses: Record<string, string>, ports: number[]): Promise<HaproxyFrontends> {
  const dir = mkdtempSync(join(tmpdir(), "slotbroker-haproxy-"));
  const configPath = join(dir, "haproxy.cfg");
  writeFileSync(configPath, config);
  const child = spawn(requireTool("haproxy"), ["-db", "-f", configPath], { stdio: ["ignore", "pipe", "pipe"] });
  let output = "";
  const collect = (chunk: Buffer): void => {
    output = (output + chunk.toString()).slice(-10_000);
  };
  child.stdout.on("data", collect);
  child.stderr.on("data", collect);
  const handle: HaproxyFrontends = { addresses, child, output: () => output };
  track(handle, `haproxy ${Object.values(addresses).join(", ")}`, async () => {
    if (child.exitCode === null && child.signalCode === null) {
      const exited = new Promise<void>((done) => child.once("exit", () => done()));
      child.kill("SIGKILL");
      await exited;
    }
    rmSync(dir, { recursive: true, force: true });
  });
  try {
    await Promise.all(ports.map((port) => untilAccepts(port, child, () => output)));
  } catch (err) {
    await release(handle);
    throw err;
  }
  return handle;
}

// Polls (bounded) until a bare TCP connect to the port succeeds; fails at once when HAProxy exits.
async function untilAccepts(port: number, child: ChildProcess, output: () => string, timeoutMs = 15_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    if (child.exitCode !== null || child.signalCode !== null) throw new Error(`haproxy exited with ${child.exitCode ?? child.signalCode}: ${output()}`);
    if (await accepts(port)) return;
    if (Date.now() > deadline) throw new Error(`haproxy did not listen on ${port} within ${timeoutMs} ms\n${output()}`);
    await new Promise((r) => setTimeout(r, 25));
  }
}

// A bare TCP connect (closed at once): HAProxy accepts it even before a backend is chosen.
function accepts(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const socket = connect(port, "127.0.0.1");
    socket.once("connect", () => {
      socket.destroy();
      resolve(true);
    });
    socket.once("error", () => resolve(false));
  });
}
