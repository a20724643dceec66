import type { Hello } from "../../../gen/slotbroker/v1/broker_pb.js";
import type { ConnectionState } from "./connection-state.js";
import { UnknownServiceError } from "./errors.js";
import type { PoolTransport } from "./pool.js";

/** What the fail-fast check reads of an address pool. */
export interface ListingPool {
  readonly transport: PoolTransport;
  mayServe(service: string): boolean;
}

/** What the fail-fast check reads of a connection. */
export interface ListingConnection {
  readonly state: ConnectionState;
  readonly hello: Hello | undefined;
}

/**
 * True unless instances are connected and none lists `service`, and no polled address may
 * serve it. A draining instance that lists it counts (a rolling restart: a replacement is
 * likely). No allocation: this runs on every acquire.
 */
export function listedAnywhere(pools: Iterable<ListingPool>, conns: Iterable<ListingConnection>, service: string): boolean {
  let connected = false;
  for (const pool of pools) {
    if (pool.transport !== "polling") continue;
    if (pool.mayServe(service)) return true;
    connected = true;
  }
  for (const conn of conns) {
    if (conn.state !== "ready") continue;
    connected = true;
    if (conn.hello && service in conn.hello.services) return true;
  }
  return !connected;
}

/**
 * The error for a service no connected instance lists, naming what they do offer.
 * `polledAddresses` counts polled addresses among the instances asked.
 */
export function unknownServiceError(service: string, conns: Iterable<ListingConnection>, polledAddresses = 0): UnknownServiceError {
  const ready = [...conns].filter((c) => c.state === "ready");
  const offered = [...new Set(ready.flatMap((c) => Object.keys(c.hello?.services ?? {})))];
  return new UnknownServiceError(service, offered.sort(), ready.length + polledAddresses);
}
