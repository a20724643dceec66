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
