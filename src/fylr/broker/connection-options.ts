import type { Done, Hello, Offer, Position, Reject } from "../../../gen/slotbroker/v1/broker_pb.js";
import type { Logger } from "../../shared/log.js";
import type { RetryPolicy } from "../../shared/retry.js";
import type { BrokerTlsOptions } from "./channel-setup.js";
import type { ConnectionState } from "./connection-state.js";

/** Liveness and reconnect timings of a broker connection. */
export interface ConnectionTimings {
  /** gRPC keepalive: HTTP/2 PING interval (half-open detection below the stream). */
  readonly keepaliveTimeMs: number;
  /** gRPC keepalive: how long a PING may go unanswered before the transport is dropped. */
  readonly keepaliveTimeoutMs: number;
  /** Application Ping interval while ready. */
  readonly pingIntervalMs: number;
  /** An application Ping unanswered this long restarts the stream. */
  readonly pingTimeoutMs: number;
  /** A stream that shows no HELLO this long after opening is restarted. */
  readonly helloTimeoutMs: number;
  /** Reconnect delays (jittered, so many fylrs do not reconnect in lockstep). */
  readonly backoff: RetryPolicy;
}

/** Defaults for ConnectionTimings; the broker config's defaults are these (one source). */
export const defaultConnectionTimings: ConnectionTimings = {
  keepaliveTimeMs: 300_000,
  keepaliveTimeoutMs: 20_000,
  pingIntervalMs: 10_000,
  pingTimeoutMs: 5_000,
  helloTimeoutMs: 10_000,
  backoff: { initialMs: 100, maxMs: 10_000, multiplier: 2, jitter: 0.5 },
};

/** Everything one broker connection needs. */
export interface BrokerConnectionOptions {
  /** The execserver (or load balancer) address, "host:port". */
  readonly address: string;
  /** Bearer token for the execserver; sent as `authorization` metadata. */
  readonly token?: string;
  /** This fylr's name, sent as `slotbroker-client` metadata. */
  readonly clientName: string;
  /** Use TLS; plaintext when unset. */
  readonly tls?: BrokerTlsOptions;
  readonly timings?: Partial<ConnectionTimings>;
  /** A label for logs, e.g. "127.0.0.1:7600#2". */
  readonly name?: string;
  readonly logger?: Logger;
}

/** The events a broker connection emits. */
/** A want as this connection parked it. */
export interface ParkedWantInfo {
  readonly service: string;
  readonly priority: number;
  /** When the want was parked on this connection (Date.now()). */
  readonly parkedAt: number;
}

export interface BrokerConnectionEvents {
  /** The lifecycle moved. */
  state: [state: ConnectionState, previous: ConnectionState];
  /** A HELLO arrived; `first` is true for the first HELLO of a stream (before "ready"). */
  hello: [hello: Hello, first: boolean];
  /**
   * A slot was offered; the want is no longer parked here. Answer with accept or decline.
   * `parked`: how the want was parked here, or undefined when it no longer was (an UNWANT
   * went out for it, so the server withdraws the offer and a JOB cannot take it).
   */
  offer: [offer: Offer, parked: ParkedWantInfo | undefined];
  done: [done: Done];
  position: [position: Position];
  reject: [reject: Reject];
  /** The connection dropped these parked wants (service no longer listed, or closed). */
  unparked: [jobIds: readonly string[]];
  /** These jobs were running when the stream dropped; the execserver cancels them. */
  lost: [jobIds: readonly string[], error: Error];
  /** An application Ping round trip, in milliseconds. */
  rtt: [ms: number];
}
