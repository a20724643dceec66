import type { Socket } from "node:net";

/** The client connection preface of HTTP/2 with prior knowledge (RFC 9113 §3.4). */
export const HTTP2_PREFACE = Buffer.from("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", "latin1");

/** Which HTTP a connection speaks, judged from its first bytes. */
export type WireProtocol = "h1" | "h2";

/**
 * Classifies the first bytes of a connection: "h2" once the whole preface is there,
 * "h1" at the first byte that differs from it, "undecided" while `head` is a proper
 * prefix of the preface (a client may send it in pieces).
 */
export function classifyPreface(head: Uint8Array): WireProtocol | "undecided" {
  const n = Math.min(head.length, HTTP2_PREFACE.length);
  for (let i = 0; i < n; i++) {
    if (head[i] !== HTTP2_PREFACE[i]) return "h1";
  }
  return head.length >= HTTP2_PREFACE.length ? "h2" : "undecided";
}

/**
 * Reads the first bytes of `socket` until the protocol is known, puts them back and
 * calls `decide`. The socket stays paused with the bytes unshifted: Node's HTTP/2
 * session drains a socket's buffered bytes itself, while the HTTP/1 server needs a
 * `resume()` to see them (its parser reads later bytes straight from the handle).
 * A socket that closes, errors or stays silent past `timeoutMs` is destroyed.
 */
export function sniffProtocol(socket: Socket, timeoutMs: number, decide: (protocol: WireProtocol) => void): void {
  const parts: Buffer[] = [];
  const cleanup = (): void => {
    socket.off("data", onData);
    socket.off("end", onEnd);
    socket.off("error", onError);
    socket.off("timeout", onTimeout);
    socket.setTimeout(0);
  };
  const onData = (chunk: Buffer): void => {
    parts.push(chunk);
    const head = parts.length === 1 ? chunk : Buffer.concat(parts);
    const protocol = classifyPreface(head);
    if (protocol === "undecided") return;
    cleanup();
    socket.pause();
    socket.unshift(head);
    decide(protocol);
  };
  const onEnd = (): void => {
    cleanup();
    socket.destroy();
  };
  const onError = (): void => {
    cleanup();
    socket.destroy();
  };
  const onTimeout = (): void => {
    cleanup();
    socket.destroy();
  };
  socket.on("data", onData);
  socket.on("end", onEnd);
  socket.on("error", onError);
  socket.on("timeout", onTimeout);
  socket.setTimeout(timeoutMs);
}
