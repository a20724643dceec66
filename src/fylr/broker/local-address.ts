import { createSocket } from "node:dgram";
import { isIP } from "node:net";
import * as grpc from "@grpc/grpc-js";
import { splitHostPort } from "../../shared/config-parsing.js";

/** This side's address of a connection, and how it was found. */
export interface LocalAddress {
  readonly host: string;
  /** The TCP source port; undefined when only the host is known (UDP probe). */
  readonly port: number | undefined;
  readonly source: "channelz" | "udp";
}

// The channelz handlers are grpc-js's server-side implementations of the channelz
// service; they answer synchronously through the callback, so calling them directly reads
// grpc-js's own socket bookkeeping without running a channelz server.
/** A grpc-js channel as a client hands it out. */
export type GrpcChannel = ReturnType<grpc.Client["getChannel"]>;

type Callback = (err: { details?: string } | null, value?: unknown) => void;
type Handler = (call: { request: Record<string, string> }, callback: Callback) => void;

interface AddressMessage {
  tcpip_address?: { ip_address?: Buffer | Uint8Array; port?: number } | null;
}

/**
 * The local TCP address of `channel`'s connected socket, read through grpc-js channelz
 * (channel → READY subchannel → socket → local). Undefined when channelz is disabled, the
 * channel has no READY subchannel, or the socket is not TCP.
 */
export async function channelzLocalAddress(channel: GrpcChannel): Promise<LocalAddress | undefined> {
  const handlers = grpc.getChannelzHandlers() as unknown as Record<string, Handler>;
  const ref = channel.getChannelzRef();
  const channelMsg = (await callHandler(handlers.GetChannel!, { channel_id: String(ref.id) })) as
    | { channel?: { subchannel_ref?: { subchannel_id: string | number }[] } }
    | undefined;
  for (const sub of channelMsg?.channel?.subchannel_ref ?? []) {
    const subMsg = (await callHandler(handlers.GetSubchannel!, { subchannel_id: String(sub.subchannel_id) })) as
      | { subchannel?: { data?: { state?: { state?: string } }; socket_ref?: { socket_id: string | number }[] } }
      | undefined;
    if (subMsg?.subchannel?.data?.state?.state !== "READY") continue;
    for (const sock of subMsg.subchannel.socket_ref ?? []) {
      const sockMsg = (await callHandler(handlers.GetSocket!, { socket_id: String(sock.socket_id) })) as
        | { socket?: { local?: AddressMessage | null } }
        | undefined;
      const tcp = sockMsg?.socket?.local?.tcpip_address;
      const host = tcp?.ip_address ? ipFromBytes(tcp.ip_address) : undefined;
      if (host) return { host, port: tcp?.port, source: "channelz" };
    }
  }
  return undefined;
}

function callHandler(handler: Handler, request: Record<string, string>): Promise<unknown> {
  return new Promise((resolve) => {
    try {
      // A NOT_FOUND (the entity went away meanwhile) reads as "unknown", not as a failure.
      handler({ request }, (err, value) => resolve(err ? undefined : value));
    } catch {
      resolve(undefined);
    }
  });
}

/** Text form of a 4- or 16-byte IP address; IPv4-mapped IPv6 becomes plain IPv4. */
export function ipFromBytes(bytes: Uint8Array): string | undefined {
  if (bytes.length === 4) return Array.from(bytes).join(".");
  if (bytes.length !== 16) return undefined;
  const mapped = bytes.subarray(0, 10).every((b) => b === 0) && bytes[10] === 0xff && bytes[11] === 0xff;
  if (mapped) return Array.from(bytes.subarray(12)).join(".");
  const groups: string[] = [];
  for (let i = 0; i < 16; i += 2) groups.push(((bytes[i]! << 8) | bytes[i + 1]!).toString(16));
  return compressIPv6(groups);
}

// RFC 5952: the longest run (≥ 2) of zero groups becomes "::".
function compressIPv6(groups: string[]): string {
  let bestStart = -1;
  let bestLen = 0;
  for (let i = 0; i < groups.length; ) {
    if (groups[i] !== "0") {
      i++;
      continue;
    }
    let j = i;
    while (j < groups.length && groups[j] === "0") j++;
    if (j - i > bestLen) [bestStart, bestLen] = [i, j - i];
    i = j;
  }
  if (bestLen < 2) return groups.join(":");
  return `${groups.slice(0, bestStart).join(":")}::${groups.slice(bestStart + bestLen).join(":")}`;
}

/**
 * The source address the kernel picks for packets to `host:port`, read from a connected
 * UDP socket. connect() on UDP only consults the routing table; nothing is sent.
 */
export function udpLocalAddress(host: string, port: number): Promise<LocalAddress | undefined> {
  const type = isIP(host) === 6 || host.includes(":") ? "udp6" : "udp4";
  return new Promise((resolve) => {
    const socket = createSocket(type);
    const finish = (value: LocalAddress | undefined): void => {
      socket.removeAllListeners();
      // close() throws when the socket is already closed; nothing else can fail here.
      try {
        socket.close();
      } catch {
        /* already closed */
      }
      resolve(value);
    };
    socket.once("error", () => finish(undefined));
    socket.connect(port, host, () => {
      const { address } = socket.address();
      finish({ host: unmapIPv4(address), port: undefined, source: "udp" });
    });
  });
}

function unmapIPv4(address: string): string {
  return address.startsWith("::ffff:") && isIP(address.slice(7)) === 4 ? address.slice(7) : address;
}

/**
 * This fylr's address on a broker connection: channelz first (the connection's own socket,
 * exact even with several interfaces), then a connected UDP socket towards the same
 * target (the kernel's routing choice; right unless policy routing treats UDP and TCP
 * differently). Undefined only when both fail.
 */
export async function resolveLocalAddress(channel: GrpcChannel | undefined, target: string): Promise<LocalAddress | undefined> {
  if (channel) {
    const viaChannelz = await channelzLocalAddress(channel);
    if (viaChannelz) return viaChannelz;
  }
  const hp = splitHostPort(target);
  if (!hp) return undefined;
  return udpLocalAddress(hp.host, hp.port);
}
