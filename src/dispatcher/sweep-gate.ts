/**
 * When a fylr may sweep its siblings' stale claims. A heartbeat older than the threshold
 * means "dead" only if the sweeper itself could have seen the sibling's heartbeats all that
 * time. After a database outage every heartbeat is stale at once, and a sibling that has
 * not reconnected yet is as alive as this fylr; right after start, likewise. So: no sweep
 * until this fylr has been healthy (database reachable) for `staleAfterMs`, counted from
 * its start and again from the end of every outage.
 */
export class SweepGate {
  private healthySince: number | undefined;

  constructor(
    private readonly staleAfterMs: number,
    now: number,
  ) {
    this.healthySince = now;
  }

  /** A database round trip failed: the healthy period starts over at the next success. */
  unhealthy(): void {
    this.healthySince = undefined;
  }

  /** A pass reached the database. */
  healthy(now: number): void {
    this.healthySince ??= now;
  }

  /** True once healthy for the whole stale threshold. */
  mayReap(now: number): boolean {
    return this.healthySince !== undefined && now - this.healthySince >= this.staleAfterMs;
  }
}
