/**
 * Whether this fylr's database takes its writes, as its heartbeat finds out: the
 * readiness check behind /readyz. Pure: times are passed in (performance.now()).
 *
 * A heartbeat that failed says so at once; one that hangs (a database that accepts the
 * connection but never finishes the write) says so once the last written beat is older
 * than `maxAgeMs`. Other writes that the database refused for lack of room or because it
 * is read-only (see refusesWrites) count for `maxAgeMs` after each: a full data disk may
 * still take the heartbeat's small in-place update while every insert fails.
 */
export class WriteHealth {
  private lastWriteAt: number;
  private failures = 0;
  private lastError = "";
  private refusal: { at: number; message: string } | undefined;

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

  /** Another write was refused by the database (disk full, read-only): see refusesWrites. */
  refused(err: unknown, now: number): void {
    this.refusal = { at: now, message: err instanceof Error ? err.message : String(err) };
  }

  /** ok, or why not. */
  report(now: number): { readonly ok: boolean; readonly detail: string } {
    const age = Math.max(0, now - this.lastWriteAt);
    const ago = `${(age / 1000).toFixed(1)} s ago`;
    if (this.failures > 0) {
      return { ok: false, detail: `the last ${this.failures} heartbeat write(s) failed (last written ${ago}): ${this.lastError}` };
    }
    if (age > this.maxAgeMs) return { ok: false, detail: `no heartbeat written for ${(age / 1000).toFixed(1)} s (a write is still waiting for the database)` };
    if (this.refusal && now - this.refusal.at <= this.maxAgeMs) {
      return { ok: false, detail: `the database refused a write ${((now - this.refusal.at) / 1000).toFixed(1)} s ago: ${this.refusal.message}` };
    }
    return { ok: true, detail: `heartbeat written ${ago}` };
  }
}

// disk_full, read_only_sql_transaction, io_error, insufficient_privilege: the database
// takes no writes from this fylr now.
const refusingStates = new Set(["53100", "25006", "58030", "42501"]);

/** True for an error (a pg error, or a SlotbrokerError translated from one) that says the database takes no writes now. */
export function refusesWrites(err: unknown): boolean {
  for (let e: unknown = err; e; e = (e as { cause?: unknown }).cause) {
    const state = (e as { code?: unknown; details?: { sqlState?: unknown } }).details?.sqlState ?? (e as { code?: unknown }).code;
    if (typeof state === "string" && refusingStates.has(state)) return true;
  }
  return false;
}

/** How old the last written heartbeat may be before readiness fails: 3 intervals, at least 5 s. */
export function writeHealthMaxAgeMs(heartbeatIntervalMs: number): number {
  return Math.max(3 * heartbeatIntervalMs, 5000);
}
