import type { BrokerConnection } from "./connection.js";

/**
 * The losers' wants of won races, withdrawn after a short grace (see unwantGrace in the
 * config): an offer already in flight from another execserver arrives meanwhile and gets a
 * DECLINE, which its execserver counts, instead of vanishing in a silent UNWANT. One queue
 * and one timer for all of them, flushed in order.
 */
export class UnwantQueue {
  private readonly entries: { conn: BrokerConnection; jobId: string; at: number }[] = [];
  private timer: NodeJS.Timeout | undefined;

  constructor(private readonly graceMs: number) {}

  /** UNWANTs `jobId` on `conns` after the grace (at once when it is 0). */
  add(conns: readonly BrokerConnection[], jobId: string): void {
    if (conns.length === 0) return;
    if (this.graceMs <= 0) {
      for (const conn of conns) conn.unwant(jobId);
      return;
    }
    const at = Date.now() + this.graceMs;
    for (const conn of conns) this.entries.push({ conn, jobId, at });
    this.timer ??= setTimeout(() => this.flushDue(), this.graceMs);
  }

  /** Sends every queued UNWANT now and stops the timer (closing). */
  flushAll(): void {
    clearTimeout(this.timer);
    this.timer = undefined;
    for (const { conn, jobId } of this.entries.splice(0)) conn.unwant(jobId);
  }

  private flushDue(): void {
    this.timer = undefined;
    const now = Date.now();
    let due = 0;
    while (due < this.entries.length && this.entries[due]!.at <= now) {
      const { conn, jobId } = this.entries[due++]!;
      // A surplus offer that arrived meanwhile already took the want off this connection.
      conn.unwant(jobId);
    }
    this.entries.splice(0, due);
    const next = this.entries[0];
    if (next) this.timer = setTimeout(() => this.flushDue(), Math.max(1, next.at - now));
  }
}
