import { Transitions } from "../../shared/lifecycle.js";

/**
 * A broker connection's lifecycle. "connecting" covers dialling and waiting for the first
 * HELLO; "ready" means a HELLO arrived on the current stream; "backoff" waits before the
 * next attempt; "closed" is final.
 */
export type ConnectionState = "idle" | "connecting" | "ready" | "backoff" | "closed";

const transitions = new Transitions<ConnectionState>("broker connection", {
  idle: ["connecting", "closed"],
  connecting: ["ready", "backoff", "closed"],
  ready: ["backoff", "closed"],
  backoff: ["connecting", "closed"],
  closed: [],
});

/** True when `from → to` is a legal transition. */
export function canTransition(from: ConnectionState, to: ConnectionState): boolean {
  return transitions.can(from, to);
}

/** Throws IllegalTransitionError on an illegal transition. */
export function checkTransition(from: ConnectionState, to: ConnectionState): void {
  transitions.check(from, to);
}

/**
 * Why a HELLO on a live stream cannot be believed, or undefined when it can. A stream reaches
 * one instance: a HELLO naming another would file the stream (and its running jobs) under
 * that instance and its services list.
 */
export function laterHelloProblem(connection: string, streamInstance: string | undefined, helloInstance: string): string | undefined {
  if (helloInstance === streamInstance) return undefined;
  return `${connection} sent a HELLO for instance ${JSON.stringify(helloInstance.slice(0, 80))} on a stream that reached instance ${JSON.stringify(streamInstance)}`;
}
