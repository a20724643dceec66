import { Code, SlotbrokerError } from "../../shared/errors.js";

/**
 * A broker connection's lifecycle. "connecting" covers dialling and waiting for the first
 * HELLO; "ready" means a HELLO arrived on the current stream; "backoff" waits before the
 * next attempt; "closed" is final.
 */
export type ConnectionState = "idle" | "connecting" | "ready" | "backoff" | "closed";

const transitions: Record<ConnectionState, readonly ConnectionState[]> = {
  idle: ["connecting", "closed"],
  connecting: ["ready", "backoff", "closed"],
  ready: ["backoff", "closed"],
  backoff: ["connecting", "closed"],
  closed: [],
};

/** True when `from → to` is a legal transition. */
export function canTransition(from: ConnectionState, to: ConnectionState): boolean {
  return transitions[from].includes(to);
}

/** Throws an Internal SlotbrokerError on an illegal transition. */
export function checkTransition(from: ConnectionState, to: ConnectionState): void {
  if (!canTransition(from, to)) {
    throw new SlotbrokerError(Code.Internal, `illegal broker connection transition ${from} → ${to}`);
  }
}
