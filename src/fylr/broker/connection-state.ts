/**
 * What one broker connection keeps track of, pure bookkeeping with no sockets: its
 * lifecycle, the wants parked on it, its application Pings in flight and its reconnect
 * backoff. The connection (connection.ts) sends the frames and runs the timers.
 */
import type { Hello } from "../../../gen/slotbroker/v1/broker_pb.js";
import { Code, SlotbrokerError } from "../../shared/errors.js";
import { Transitions } from "../../shared/lifecycle.js";
import { retryDelayMs, type RetryPolicy } from "../../shared/retry.js";

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

/** A want as this connection parked it. */
export interface ParkedWantInfo {
  readonly service: string;
  readonly priority: number;
  /** Want.fairness_key ("" = the default key). */
  readonly fairnessKey: string;
  /** Want.fairness_weight as sent (0 = 1). */
  readonly fairnessWeight: number;
  /** When the want was parked on this connection (Date.now()). */
  readonly parkedAt: number;
}

/**
 * The wants parked on one connection (or waiting to be re-registered on its next stream),
 * oldest first. Pure bookkeeping: the connection sends the WANT and UNWANT frames.
 */
export class ParkedWants {
  // Map iteration follows insertion order, so the first entry is the oldest.
  private readonly wants = new Map<string, ParkedWantInfo>();

  /** Wants parked. */
  get size(): number {
    return this.wants.size;
  }

  /** True when `jobId` is parked. */
  has(jobId: string): boolean {
    return this.wants.has(jobId);
  }

  /** Parks `jobId` (a want parked again keeps its place and takes the new details). */
  add(jobId: string, want: ParkedWantInfo): void {
    this.wants.set(jobId, want);
  }

  /** Forgets `jobId`; true when it was parked. */
  delete(jobId: string): boolean {
    return this.wants.delete(jobId);
  }

  /** Removes `jobId` and returns how it was parked (undefined when it was not). */
  take(jobId: string): ParkedWantInfo | undefined {
    const want = this.wants.get(jobId);
    if (want) this.wants.delete(jobId);
    return want;
  }

  /** When the oldest want was parked; undefined when none is. */
  oldestParkedAt(): number | undefined {
    for (const want of this.wants.values()) return want.parkedAt;
    return undefined;
  }

  /** Every parked want, oldest first. */
  entries(): IterableIterator<[string, ParkedWantInfo]> {
    return this.wants.entries();
  }

  /** Forgets every want; returns their job ids, oldest first. */
  clear(): string[] {
    const dropped = [...this.wants.keys()];
    this.wants.clear();
    return dropped;
  }

  /** Forgets the wants `hello` does not serve (service not listed, or draining); returns their ids. */
  dropUnserved(hello: Pick<Hello, "services" | "draining">): string[] {
    const dropped: string[] = [];
    for (const [jobId, want] of this.wants) {
      if (want.service in hello.services && !hello.draining) continue;
      this.wants.delete(jobId);
      dropped.push(jobId);
    }
    return dropped;
  }
}

interface PendingPing {
  sentAt: bigint;
  timer: NodeJS.Timeout | undefined;
  readonly resolve: (ms: number) => void;
  readonly reject: (err: Error) => void;
}

/**
 * Outstanding application Pings of one connection: nonce → send time, each with its own
 * timeout. Pure bookkeeping; the connection sends the frames.
 */
export class Pings {
  private readonly pending = new Map<bigint, PendingPing>();
  private nonce = 0n;

  /**
   * Registers a ping; returns its nonce to send, the RTT promise, and `sent` to call once
   * the frame left the local write queue. Clock and timeout start only then: a Ping queued
   * behind a burst of thousands of WANTs is slow to leave, not a sign of a dead peer.
   */
  start(timeoutMs: number, label: string): { nonce: bigint; rtt: Promise<number>; sent: () => void } {
    const nonce = ++this.nonce;
    let entry: PendingPing | undefined;
    const rtt = new Promise<number>((resolve, reject) => {
      entry = { sentAt: process.hrtime.bigint(), timer: undefined, resolve, reject };
      this.pending.set(nonce, entry);
    });
    const sent = (): void => {
      if (!entry || this.pending.get(nonce) !== entry || entry.timer) return;
      entry.sentAt = process.hrtime.bigint();
      entry.timer = setTimeout(() => {
        this.pending.delete(nonce);
        entry!.reject(new SlotbrokerError(Code.DeadlineExceeded, `no Pong from ${label} within ${timeoutMs} ms`));
      }, timeoutMs);
      entry.timer.unref();
    };
    return { nonce, rtt, sent };
  }

  /** A Pong arrived; returns the round trip in ms, or undefined for an unknown nonce. */
  pong(nonce: bigint): number | undefined {
    const ping = this.pending.get(nonce);
    if (!ping) return undefined;
    this.pending.delete(nonce);
    clearTimeout(ping.timer);
    const ms = Number(process.hrtime.bigint() - ping.sentAt) / 1e6;
    ping.resolve(ms);
    return ms;
  }

  /** Fails every outstanding ping (the stream ended). */
  failAll(err: Error): void {
    for (const ping of this.pending.values()) {
      clearTimeout(ping.timer);
      ping.reject(err);
    }
    this.pending.clear();
  }
}

// A stream that stayed ready at least this long resets the backoff: a server that accepts
// and drops at once must not be hammered at the initial delay.
const STABLE_MS = 1_000;

/** When a broker connection dials again after its stream went down. Pure but for `random`. */
export class ReconnectBackoff {
  private failures = 0;
  private readySince = 0;

  constructor(
    private readonly policy: RetryPolicy,
    private readonly random: () => number = Math.random,
  ) {}

  /** The stream reached ready (its first HELLO arrived). */
  ready(now = Date.now()): void {
    this.readySince = now;
  }

  /**
   * The stream went down (`wasReady`: it had reached ready). Returns the delay before the
   * next attempt and how many attempts in a row failed so far.
   */
  down(wasReady: boolean, now = Date.now()): { delayMs: number; failures: number } {
    const stable = wasReady && now - this.readySince >= STABLE_MS;
    this.failures = stable ? 0 : this.failures + 1;
    return { delayMs: retryDelayMs(this.policy, this.failures - 1, this.random), failures: this.failures };
  }
}
