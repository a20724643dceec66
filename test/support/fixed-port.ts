// Loopback ports for servers a test restarts on the same address. Port 0 hands out ports
// from the kernel's ephemeral range, the same range outgoing connections take their local
// ports from: while the server is down, any client socket of the run may take its port and
// the restart fails. A port below that range is never given to a client socket.
import { readFileSync } from "node:fs";
import { createServer } from "node:net";

function ephemeralLow(): number {
  try {
    const low = Number(readFileSync("/proc/sys/net/ipv4/ip_local_port_range", "utf8").trim().split(/\s+/)[0]);
    if (Number.isInteger(low) && low > 2048) return low;
  } catch {
    // Not Linux: the IANA range starts at 49152; 32768 is below both.
  }
  return 32_768;
}

function bindable(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const probe = createServer();
    probe.once("error", () => resolve(false));
    probe.listen({ host: "127.0.0.1", port, exclusive: true }, () => probe.close(() => resolve(true)));
  });
}

/** `count` different free loopback ports below the ephemeral range, chosen at random (other runs may use the range too). */
export async function portsOutsideEphemeralRange(count: number): Promise<number[]> {
  const high = ephemeralLow() - 1;
  const low = Math.max(1025, high - 20_000);
  const ports: number[] = [];
  for (let tries = 0; ports.length < count; tries++) {
    if (tries === 100 + count) throw new Error(`no ${count} free loopback ports in ${low}–${high} after ${tries} tries`);
    const port = low + Math.floor(Math.random() * (high - low + 1));
    if (!ports.includes(port) && (await bindable(port))) ports.push(port);
  }
  return ports;
}
