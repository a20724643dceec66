import { Code, SlotbrokerError } from "../../shared/errors.js";

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
