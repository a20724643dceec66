import { spawn, type ChildProcess } from "node:child_process";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { connect } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { freePort } from "../../src/shared/embedded-postgres.js";
import { track } from "./resources.js";
import { requireTool, systemTools } from "./system-tools.js";
import { waitFor } from "./execserver-process.js";

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
 * `backends` ("host:port"). HAProxy cannot bind port 0, so the port is picked first.
 */
export async function startHaproxy(backends: readonly string[]): Promise<Haproxy> {
  const dir = mkdtempSync(join(tmpdir(), "slotbroker-haproxy-"));
  const port = await freePort();
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
    "frontend broker",
    `  bind 127.0.0.1:${port}`,
    "  default_backend execservers",
    "backend execservers",
    "  balance roundrobin",
    ...backends.map((backend, i) => `  server s${i + 1} ${backend}`),
    "",
  ].join("\n");
  const configPath = join(dir, "haproxy.cfg");
  writeFileSync(configPath, config);
  const child = spawn(requireTool("haproxy"), ["-db", "-f", configPath], { stdio: ["ignore", "pipe", "pipe"] });
  let output = "";
  const collect = (chunk: Buffer): void => {
    output = (output + chunk.toString()).slice(-10_000);
  };
  child.stdout.on("data", collect);
  child.stderr.on("data", collect);
  const address = `127.0.0.1:${port}`;
  const handle: Haproxy = { address, child, output: () => output };
  track(handle, `haproxy ${address}`, async () => {
    if (child.exitCode === null && child.signalCode === null) {
      const exited = new Promise<void>((done) => child.once("exit", () => done()));
      child.kill("SIGKILL");
      await exited;
    }
    rmSync(dir, { recursive: true, force: true });
  });
  await waitFor(`haproxy to listen on ${address}\n${output}`, () => {
    if (child.exitCode !== null) throw new Error(`haproxy exited with ${child.exitCode}: ${output}`);
    return accepts(port);
  });
  return handle;
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
