/**
 * Ports for servers that must be told their port before they bind: PostgreSQL and HAProxy
 * (no port 0), a server that a client is aimed at before it starts, a restart on the same
 * port. A server that can bind port 0 should, and report the port it got.
 *
 * Picking by binding port 0, closing and binding again later is a race: the kernel hands
 * out ports from the same ephemeral range (ip_local_port_range) to every outgoing
 * connection and every other bind(0), so on a busy loopback the port can be taken in
 * between. The ports picked here lie outside that range, where the kernel hands nothing
 * out by itself; what is left is another process choosing the same port explicitly,
 * which a caller that may still move meets with withFreePorts.
 */
import { readFileSync } from "node:fs";
import { createServer } from "node:net";

/** An inclusive range of TCP ports. */
export interface PortRange {
  readonly low: number;
  readonly high: number;
}

const rangeFile = "/proc/sys/net/ipv4/ip_local_port_range";
// Below this, ports are privileged or belong to well-known services.
const lowestPick = 10_000;
// A range narrower than this leaves too few ports to pick from at random.
const narrowest = 1_000;

/** The kernel's ephemeral port range, from its "LOW HIGH" text; undefined when malformed. */
export function parsePortRange(text: string): PortRange | undefined {
  const [low, high] = text.trim().split(/\s+/).map(Number);
  if (!Number.isInteger(low) || !Number.isInteger(high) || low! < 1 || high! > 65_535 || low! > high!) return undefined;
  return { low: low!, high: high! };
}

/**
 * Where to pick ports that the kernel never hands out by itself: below the ephemeral range
 * (down to 10000), else above it; undefined when neither side leaves 1000 ports.
 */
export function pickRangeOutside(ephemeral: PortRange): PortRange | undefined {
  const below = { low: Math.max(lowestPick, ephemeral.low - 16_384), high: ephemeral.low - 1 };
  if (below.high - below.low + 1 >= narrowest) return below;
  const above = { low: Math.max(lowestPick, ephemeral.high + 1), high: 65_535 };
  if (above.high - above.low + 1 >= narrowest) return above;
  return undefined;
}

function readPickRange(): PortRange | undefined {
  let text: string;
  try {
    text = readFileSync(rangeFile, "utf8");
  } catch {
    return undefined; // not Linux
  }
  const ephemeral = parsePortRange(text);
  return ephemeral && pickRangeOutside(ephemeral);
}

/**
 * A TCP port free on 127.0.0.1 now, outside the kernel's ephemeral range (see the top of
 * this file); where that range cannot be read or leaves no room, one the kernel picks.
 */
export async function freePort(): Promise<number> {
  const range = readPickRange();
  if (range) {
    for (let attempt = 0; attempt < 50; attempt++) {
      const port = range.low + Math.floor(Math.random() * (range.high - range.low + 1));
      if ((await tryBind(port)) === port) return port;
    }
  }
  const port = await tryBind(0);
  if (port === undefined) throw new Error("cannot bind any TCP port on 127.0.0.1");
  return port;
}

// Binds 127.0.0.1:port exclusively and closes at once: the bound port, or undefined when taken.
function tryBind(port: number): Promise<number | undefined> {
  return new Promise((resolve) => {
    const server = createServer();
    server.once("error", () => resolve(undefined));
    server.listen({ host: "127.0.0.1", port, exclusive: true }, () => {
      const address = server.address();
      const bound = typeof address === "object" && address ? address.port : undefined;
      server.close(() => resolve(bound));
    });
  });
}

/** Whether a start failed because its port was taken (EADDRINUSE, or a server's own words for it). */
export function isAddressInUse(err: unknown): boolean {
  const e = err as { code?: unknown; message?: unknown } | undefined;
  return e?.code === "EADDRINUSE" || /EADDRINUSE|address already in use/i.test(String(e?.message ?? err));
}

/**
 * Starts something on `count` fresh ports from freePort(); when the start fails because
 * a port was taken between the pick and the bind, picks again (up to `attempts` times).
 * Sound only while nobody has been told the ports yet.
 */
export async function withFreePorts<T>(count: number, start: (ports: number[]) => Promise<T>, attempts = 5): Promise<T> {
  for (let attempt = 1; ; attempt++) {
    const ports: number[] = [];
    while (ports.length < count) {
      const port = await freePort();
      if (!ports.includes(port)) ports.push(port);
    }
    try {
      return await start(ports);
    } catch (err) {
      if (attempt >= attempts || !isAddressInUse(err)) throw err;
    }
  }
}

/** withFreePorts for one port. */
export function withFreePort<T>(start: (port: number) => Promise<T>, attempts?: number): Promise<T> {
  return withFreePorts(1, ([port]) => start(port!), attempts);
}
