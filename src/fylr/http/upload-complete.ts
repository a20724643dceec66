import type { Http2Session } from "node:http2";
import type { HttpRequest } from "./http-types.js";
import { requestBodyIntact } from "./responses.js";

/**
 * Resolves true when the request body really ended, false when it was cut off.
 *
 * HTTP/1.1 is unambiguous: a missing final chunk or short Content-Length marks the body
 * incomplete. HTTP/2 is not: Node's `Http2Stream.close(code)` — what connect-node's client
 * calls when a call is aborted — first ends the writable side (END_STREAM) and only then
 * sends RST_STREAM, in a later write. The server sees a clean end and, about a millisecond
 * later, the reset. So after END_STREAM we send a PING and wait for its ACK: frames on a
 * connection arrive in order, and a client that resets right after END_STREAM has sent
 * the RST before it could see our PING, so by the ACK the reset has been processed.
 */
export async function uploadComplete(req: HttpRequest, timeoutMs = 30_000): Promise<boolean> {
  if (!requestBodyIntact(req)) return false;
  if (!("stream" in req)) return true;
  const session = req.stream.session;
  if (!session) return false;
  try {
    await pingBarrier(session, timeoutMs);
  } catch {
    return false;
  }
  return requestBodyIntact(req);
}

interface Barrier {
  /** Waiters covered by the PING in flight. */
  current: Waiter[];
  /** Waiters that arrived after it was sent; they need a fresh PING. */
  next: Waiter[];
}

interface Waiter {
  resolve(): void;
  reject(err: Error): void;
}

const barriers = new WeakMap<Http2Session, Barrier>();

// One PING in flight per session at most (Node caps outstanding pings); waiters that
// arrive meanwhile share the following one, since only a PING sent after their
// END_STREAM proves ordering for them.
function pingBarrier(session: Http2Session, timeoutMs: number): Promise<void> {
  return new Promise((resolve, reject) => {
    let barrier = barriers.get(session);
    if (!barrier) {
      barrier = { current: [], next: [] };
      barriers.set(session, barrier);
    }
    const waiter: Waiter = { resolve, reject };
    if (barrier.current.length > 0) {
      barrier.next.push(waiter);
      return;
    }
    barrier.current.push(waiter);
    sendPing(session, barrier, timeoutMs);
  });
}

function sendPing(session: Http2Session, barrier: Barrier, timeoutMs: number): void {
  let settled = false;
  const settle = (err: Error | null): void => {
    if (settled) return;
    settled = true;
    clearTimeout(timer);
    const waiters = barrier.current;
    barrier.current = barrier.next;
    barrier.next = [];
    for (const w of waiters) {
      if (err) w.reject(err);
      else w.resolve();
    }
    if (barrier.current.length > 0) sendPing(session, barrier, timeoutMs);
  };
  const timer = setTimeout(() => settle(new Error("no PING acknowledgement from the client")), timeoutMs);
  timer.unref();
  try {
    if (session.destroyed || session.closed) throw new Error("the HTTP/2 session is gone");
    session.ping((err) => settle(err));
  } catch (err) {
    settle(err as Error);
  }
}
