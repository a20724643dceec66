/**
 * Whether this fylr's database takes its writes, as its heartbeat finds out: the
 * readiness check behind /readyz. Pure: times are passed in (performance.now()).
 *
 * A heartbeat that failed says so at once; one that hangs (a database that accepts the
 * connection but never finishes the write) says so once the last written beat is older
 * than `maxAgeMs`.
 */
export class WriteHealth {
  private lastWriteAt: number;
  private failures = 0;
  private lastError = "";

  constructor(
    private readonly maxAgeMs: number,
    now: number,
  ) {
    this.lastWriteAt = now;
  }

  /** A heartbeat (or registration) was written. */
  wrote(now: number): void {
    this.lastWriteAt = now;
    this.failures = 0;
    this.lastError = "";
  }

  /** A heartbeat write failed. */
  failed(err: unknown): void {
    this.failures += 1;
    this.lastError = err instanceof Error ? err.message : String(err);
  }

  /** ok, or why not. */
  report(now: number): { readonly ok: boolean; readonly detail: string } {
    const age = Math.max(0, now - this.lastWriteAt);
    const ago = `${(age / 1000).toFixed(1)} s ago`;
    if (this.failures > 0) {
      return { ok: false, detail: `the last ${this.failures} heartbeat write(s) failed (last written ${ago}): ${this.lastError}` };
    }
    if (age > this.maxAgeMs) return { ok: false, detail: `no heartbeat written for ${(age / 1000).toFixed(1)} s (a write is still waiting for the database)` };
    return { ok: true, detail: `heartbeat written ${ago}` };
  }
}

/** How old the last written heartbeat may be before readiness fails: 3 intervals, at least 5 s. */
export function writeHealthMaxAgeMs(heartbeatIntervalMs: number): number {
  return Math.max(3 * heartbeatIntervalMs, 5000);
}
