import { Code, SlotbrokerError } from "../../shared/errors.js";

interface PendingPing {
  readonly sentAt: bigint;
  readonly timer: NodeJS.Timeout;
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

  /** Registers a ping; returns its nonce to send and the RTT promise. */
  start(timeoutMs: number, label: string): { nonce: bigint; rtt: Promise<number> } {
    const nonce = ++this.nonce;
    const rtt = new Promise<number>((resolve, reject) => {
      const timer = setTimeout(() => {
        this.pending.delete(nonce);
        reject(new SlotbrokerError(Code.DeadlineExceeded, `no Pong from ${label} within ${timeoutMs} ms`));
      }, timeoutMs);
      timer.unref();
      this.pending.set(nonce, { sentAt: process.hrtime.bigint(), timer, resolve, reject });
    });
    return { nonce, rtt };
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
