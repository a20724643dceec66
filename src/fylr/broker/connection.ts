/**
 * One broker stream to one address, kept alive (BrokerConnection), with the options,
 * timings and events it is built with. What it keeps track of, pure, is in
 * connection-state.ts.
 */
import { EventEmitter } from "node:events";
import { create } from "@bufbuild/protobuf";
import type * as grpc from "@grpc/grpc-js";
import {
  ConnectRequestSchema,
  type ConnectResponse,
  type Done,
  type Hello,
  type JobSpec,
  type Offer,
  type Position,
  type Reject,
} from "../../../gen/slotbroker/v1/broker_pb.js";
import { Code, SlotbrokerError } from "../../shared/errors.js";
import { silentLogger, type Logger } from "../../shared/log.js";
import { openConnectStream, translateStreamError, type BrokerTlsOptions, type ConnectCall } from "./channel-setup.js";
import { checkTransition, laterHelloProblem, ParkedWants, Pings, ReconnectBackoff, type ConnectionState, type ParkedWantInfo } from "./connection-state.js";
import { encodeCancel, encodeDecline, encodeJob, encodeQuery, encodeUnwant, encodeWant } from "./frames.js";
import { resolveLocalAddress, type LocalAddress } from "./local-address.js";

export type { BrokerTlsOptions } from "./channel-setup.js";

// The timings live with the broker config, so reading a config loads no gRPC.
import { defaultConnectionTimings, type ConnectionTimings } from "./config.js";
export { defaultConnectionTimings, type ConnectionTimings };

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

/**
 * One broker stream to one address, kept alive: connect, HELLO, reconnect with backoff,
 * re-register every still-parked want on the next stream. Each connection has its own
 * channel with a local subchannel pool, so every connection is its own TCP connection
 * even to the same address, and a load balancer can spread them.
 */
export class BrokerConnection extends EventEmitter<BrokerConnectionEvents> {
  readonly address: string;
  readonly name: string;
  private current: ConnectionState = "idle";
  private readonly options: BrokerConnectionOptions;
  private readonly timings: ConnectionTimings;
  private readonly logger: Logger;
  private readonly parked = new ParkedWants();
  private readonly running = new Set<string>();
  private readonly pings = new Pings();
  private client: grpc.Client | undefined;
  private call: ConnectCall | undefined;
  private readonly backoff: ReconnectBackoff;
  private attempt = 0;
  private latestHello: Hello | undefined;
  private localAddressPromise: Promise<LocalAddress | undefined> | undefined;
  private helloTimer: NodeJS.Timeout | undefined;
  private pingTimer: NodeJS.Timeout | undefined;
  private retryTimer: NodeJS.Timeout | undefined;
  private lastRtt: number | undefined;
  /** Streams opened so far (1 after the first connect). */
  streams = 0;
  /** Why the last stream ended, for status and errors. */
  lastError: Error | undefined;

  constructor(options: BrokerConnectionOptions) {
    super();
    this.options = options;
    this.address = options.address;
    this.name = options.name ?? options.address;
    this.timings = { ...defaultConnectionTimings, ...options.timings };
    this.backoff = new ReconnectBackoff(this.timings.backoff);
    this.logger = (options.logger ?? silentLogger).child({ component: "broker-connection", conn: this.name });
  }

  /** The lifecycle state. */
  get state(): ConnectionState {
    return this.current;
  }

  /** The latest HELLO (kept across a reconnect until the next one arrives). */
  get hello(): Hello | undefined {
    return this.latestHello;
  }

  /** The instance the current stream reaches; undefined unless ready. */
  get instanceId(): string | undefined {
    return this.current === "ready" ? this.latestHello?.instanceId : undefined;
  }

  /** The latest application Ping round trip in milliseconds. */
  get rttMs(): number | undefined {
    return this.lastRtt;
  }

  /** Wants parked (or waiting to be re-registered) on this connection. */
  get parkedCount(): number {
    return this.parked.size;
  }

  /** Jobs accepted here and not yet done. */
  get runningCount(): number {
    return this.running.size;
  }

  /** When the oldest want still parked here was parked; undefined when none is. */
  oldestParkedAt(): number | undefined {
    return this.parked.oldestParkedAt();
  }

  /** True when the current HELLO lists `service` and the instance is not draining. */
  serves(service: string): boolean {
    const hello = this.latestHello;
    return this.current === "ready" && hello !== undefined && !hello.draining && service in hello.services;
  }

  /** True when the want is parked here. */
  has(jobId: string): boolean {
    return this.parked.has(jobId);
  }

  /** idle → connecting: opens the first stream. */
  start(): void {
    this.connect();
  }

  /**
   * Parks a want under a fairness key ("" = the default key) and weight (1 by default);
   * sent now when ready, otherwise on the next stream's HELLO.
   */
  want(jobId: string, service: string, priority: number, fairnessKey = "", fairnessWeight = 1, now = Date.now()): void {
    if (this.current === "closed") return;
    // Weight 1 is the server's default: left off the wire, as an older client sends it.
    const weight = fairnessWeight === 1 ? 0 : fairnessWeight;
    this.parked.add(jobId, { service, priority, fairnessKey, fairnessWeight: weight, parkedAt: now });
    if (this.current === "ready") this.call?.write(encodeWant(jobId, service, priority, fairnessKey, weight));
  }

  /** Withdraws a want (or an outstanding offer for it); safe for unknown ids. */
  unwant(jobId: string): void {
    const had = this.parked.delete(jobId);
    if (had && this.current === "ready") this.call?.write(encodeUnwant(jobId));
  }

  /** Accepts an offer: sends JOB (with `traceparent` when traced); the job counts as running here until DONE or loss. */
  accept(offer: Offer, spec: JobSpec, traceparent?: string): boolean {
    if (this.current !== "ready") return false;
    this.running.add(offer.jobId);
    this.call?.write(encodeJob(offer.jobId, offer.offerToken, spec, traceparent));
    return true;
  }

  /** Refuses an offer; the execserver offers the slot to the next want at once. */
  decline(offer: Offer): void {
    if (this.current === "ready") this.call?.write(encodeDecline(offer.jobId, offer.offerToken));
  }

  /** True when the current HELLO lists the "cancel" capability (the server understands CANCEL). */
  get cancels(): boolean {
    return this.latestHello?.capabilities.includes("cancel") ?? false;
  }

  /** True when the current HELLO lists the "stdin-inline" capability (JobSpec.stdin_inline is understood). */
  get inlinesStdin(): boolean {
    return this.latestHello?.capabilities.includes("stdin-inline") ?? false;
  }

  /**
   * Sends CANCEL: a running job is stopped and still answers DONE. False when it could not
   * be sent (the stream is not ready, or the server lacks the "cancel" capability).
   */
  cancel(jobId: string): boolean {
    if (this.current !== "ready" || !this.cancels) return false;
    this.call?.write(encodeCancel(jobId));
    return true;
  }

  /** Asks where a want stands; the answer arrives as a "position" event. */
  query(jobId: string): void {
    if (this.current === "ready") this.call?.write(encodeQuery(jobId));
  }

  /** Forgets a running job without waiting for DONE (the caller gave up on it). */
  forgetJob(jobId: string): void {
    this.running.delete(jobId);
  }

  /** One application Ping round trip in milliseconds; rejects on timeout or stream loss. */
  ping(timeoutMs = this.timings.pingTimeoutMs): Promise<number> {
    if (this.current !== "ready") {
      return Promise.reject(new SlotbrokerError(Code.Unavailable, `broker connection ${this.name} is ${this.current}`));
    }
    const { nonce, rtt, sent } = this.pings.start(timeoutMs, this.name);
    this.call?.write(create(ConnectRequestSchema, { frame: { case: "ping", value: { nonce } } }), sent);
    return rtt;
  }

  /**
   * This fylr's address on the current stream's TCP connection (channelz, then a UDP
   * probe towards the same address). Cached per stream.
   */
  localAddress(): Promise<LocalAddress | undefined> {
    const channel = this.client?.getChannel();
    this.localAddressPromise ??= resolveLocalAddress(channel, this.address);
    return this.localAddressPromise;
  }

  /** Closes for good: running jobs are reported lost, parked wants dropped. Idempotent. */
  close(reason = "connection closed by the fylr"): void {
    if (this.current === "closed") return;
    const error = new SlotbrokerError(Code.Canceled, reason);
    this.teardown(error);
    clearTimeout(this.retryTimer);
    this.setState("closed");
    const dropped = this.parked.clear();
    if (dropped.length > 0) this.emit("unparked", dropped);
  }

  private connect(): void {
    this.setState("connecting");
    const attempt = ++this.attempt;
    this.streams++;
    this.localAddressPromise = undefined;
    const { token, clientName, tls } = this.options;
    const { keepaliveTimeMs, keepaliveTimeoutMs } = this.timings;
    let opened: ReturnType<typeof openConnectStream>;
    try {
      opened = openConnectStream({ address: this.address, token, clientName, tls, keepaliveTimeMs, keepaliveTimeoutMs });
    } catch (err) {
      // TLS files that cannot be used (and never could): a failed attempt, retried with backoff.
      this.restart(SlotbrokerError.from(err, Code.FailedPrecondition));
      return;
    }
    const { client, call } = opened;
    this.client = client;
    this.call = call;
    call.on("data", (response: ConnectResponse) => {
      if (attempt === this.attempt) this.receive(response);
    });
    call.on("error", (err: grpc.ServiceError) => {
      if (attempt === this.attempt) this.restart(translateStreamError(err, this.name));
    });
    call.on("status", (status: grpc.StatusObject) => {
      if (attempt !== this.attempt) return;
      this.restart(new SlotbrokerError(Code.Unavailable, `broker stream to ${this.name} ended (${status.details || status.code})`));
    });
    this.helloTimer = setTimeout(() => {
      if (attempt === this.attempt) {
        this.restart(new SlotbrokerError(Code.DeadlineExceeded, `no HELLO from ${this.name} within ${this.timings.helloTimeoutMs} ms`));
      }
    }, this.timings.helloTimeoutMs);
    this.helloTimer.unref();
  }

  private receive(response: ConnectResponse): void {
    const frame = response.frame;
    switch (frame.case) {
      case "hello":
        return this.onHello(frame.value);
      case "offer": {
        // The execserver took the want out of its book; it is no longer parked here. Not
        // parked here any more means we UNWANTed it: the server withdraws the offer.
        this.emit("offer", frame.value, this.parked.take(frame.value.jobId));
        return;
      }
      case "done":
        this.running.delete(frame.value.jobId);
        this.emit("done", frame.value);
        return;
      case "pong":
        return this.onPong(frame.value.nonce);
      case "position":
        this.emit("position", frame.value);
        return;
      case "reject":
        this.onReject(frame.value);
        return;
      case "offerExpired":
        // The slot holder answers before Slot.expiresAt; an expiry means the JOB was late,
        // and the STALE_OFFER Reject that answers it fails that job (see onReject).
        this.logger.debug({ jobId: frame.value.jobId }, "offer expired before our answer arrived");
        return;
      default:
        // An unknown or unset frame kind is skipped: newer servers may send more.
        this.logger.debug({ frame: frame.case }, "skipping unknown frame");
    }
  }

  private onHello(hello: Hello): void {
    const first = this.current === "connecting";
    const problem = first ? undefined : laterHelloProblem(this.name, this.latestHello?.instanceId, hello.instanceId);
    if (problem) {
      this.logger.warn({ err: problem }, "HELLO changed instance_id mid-stream; dropping the stream and reconnecting");
      return this.restart(new SlotbrokerError(Code.Internal, problem));
    }
    this.latestHello = hello;
    if (first) {
      clearTimeout(this.helloTimer);
      this.helloTimer = undefined;
    }
    // Listeners see the HELLO before anything is sent, so a pool can close a duplicate
    // without first re-registering wants on it.
    this.emit("hello", hello, first);
    if (this.current === "closed") return;
    this.dropUnservedWants(hello);
    if (!first) return;
    for (const [jobId, want] of this.parked.entries()) {
      this.call?.write(encodeWant(jobId, want.service, want.priority, want.fairnessKey, want.fairnessWeight));
    }
    this.backoff.ready();
    this.setState("ready");
    this.startPingLoop();
  }

  private dropUnservedWants(hello: Hello): void {
    const dropped = this.parked.dropUnserved(hello);
    if (dropped.length === 0) return;
    // On a live stream the execserver may still hold them; after a reconnect it never did.
    if (this.current === "ready") for (const jobId of dropped) this.call?.write(encodeUnwant(jobId));
    this.emit("unparked", dropped);
  }

  private onReject(reject: Reject): void {
    // A rejected WANT is not parked at the execserver; a rejected JOB never started.
    if (reject.jobId) {
      this.parked.delete(reject.jobId);
      this.running.delete(reject.jobId);
    }
    this.logger.debug({ jobId: reject.jobId, code: reject.code, message: reject.message }, "frame rejected");
    this.emit("reject", reject);
  }

  private onPong(nonce: bigint): void {
    const ms = this.pings.pong(nonce);
    if (ms === undefined) return;
    this.lastRtt = ms;
    this.emit("rtt", ms);
  }

  private startPingLoop(): void {
    const attempt = this.attempt;
    this.pingTimer = setInterval(() => {
      if (attempt !== this.attempt || this.current !== "ready") return;
      this.ping().catch((err: unknown) => {
        // Only a timeout on this very stream means half-open; a loss is handled elsewhere.
        if (attempt === this.attempt && this.current === "ready") this.restart(SlotbrokerError.from(err));
      });
    }, this.timings.pingIntervalMs);
    this.pingTimer.unref();
  }

  private restart(error: Error): void {
    if (this.current === "closed" || this.current === "backoff") return;
    const { delayMs: delay, failures } = this.backoff.down(this.current === "ready");
    const level = failures > 3 ? "warn" : "info";
    this.logger[level]({ err: error.message, delayMs: delay, failures }, "broker stream down; reconnecting");
    this.teardown(error);
    this.setState("backoff");
    this.retryTimer = setTimeout(() => {
      this.retryTimer = undefined;
      if (this.current === "backoff") this.connect();
    }, delay);
    this.retryTimer.unref();
  }

  // Ends the current stream and channel; parked wants stay for re-registration.
  private teardown(error: Error): void {
    this.lastError = error;
    this.attempt++;
    clearTimeout(this.helloTimer);
    clearInterval(this.pingTimer);
    this.helloTimer = this.pingTimer = undefined;
    const call = this.call;
    const client = this.client;
    this.call = this.client = undefined;
    call?.cancel();
    client?.close();
    this.pings.failAll(new SlotbrokerError(Code.Unavailable, `broker stream to ${this.name} ended before the Pong`, { cause: error }));
    if (this.running.size > 0) {
      const lost = [...this.running];
      this.running.clear();
      this.emit("lost", lost, error);
    }
  }

  private setState(next: ConnectionState): void {
    const previous = this.current;
    checkTransition(previous, next);
    this.current = next;
    this.emit("state", next, previous);
  }
}
