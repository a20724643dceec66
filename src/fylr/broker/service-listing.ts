/**
 * Whether a service can be had at all, pure: an acquisition fails fast when connected
 * instances are known and none lists its service (listedAnywhere), but only after the
 * start-up grace (StartupGrace), before which "not listed" cannot be told from "not
 * connected yet".
 */
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

/**
 * The broker client's start-up grace: until every pool reached an instance or failed once
 * (or the grace passed), "no connected execserver offers X" cannot be told from "not
 * connected yet", so acquisitions wait here first.
 */
export class StartupGrace {
  private active = false;
  private startedAt = 0;
  private readonly waiters = new Set<() => void>();

  constructor(
    private readonly graceMs: number,
    /** True once every pool reached an instance or failed once. */
    private readonly poolsSettled: () => boolean,
  ) {}

  /** The client started: the grace runs from now. */
  begin(now = Date.now()): void {
    this.active = true;
    this.startedAt = now;
  }

  /** The client closed: nothing waits any more. */
  end(): void {
    this.active = false;
    this.wake();
  }

  /** True unless the grace still runs and some pool has not settled. */
  isSettled(now = Date.now()): boolean {
    if (!this.active || now - this.startedAt >= this.graceMs) return true;
    return this.poolsSettled();
  }

  /** Something that may settle the pools happened (a connection changed state): check again. */
  wake(): void {
    for (const wake of this.waiters) wake();
  }

  /** Resolves once settled; rejects with the signal's reason when it aborts first. */
  async wait(signal: AbortSignal | undefined): Promise<void> {
    while (!this.isSettled()) {
      signal?.throwIfAborted();
      await new Promise<void>((resolve) => {
        const done = (): void => {
          clearTimeout(timer);
          this.waiters.delete(done);
          signal?.removeEventListener("abort", done);
          resolve();
        };
        const timer = setTimeout(done, Math.max(1, this.startedAt + this.graceMs - Date.now()));
        this.waiters.add(done);
        signal?.addEventListener("abort", done, { once: true });
      });
    }
  }
}
