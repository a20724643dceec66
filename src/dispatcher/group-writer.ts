/**
 * Group commit. Items change state one by one, but writing each change in its own
 * statement makes the commit (and the NOTIFY trigger it fires) the bottleneck of a busy
 * fylr. Entries that arrive while a batch is being written wait for it and go together in
 * the next one, so one entry alone still costs one round trip and a burst costs one round
 * trip per batch. The write keeps each entry's own lease fence inside the batch statement.
 */

interface Pending<T> {
  readonly entry: T;
  readonly resolve: (written: boolean) => void;
  readonly reject: (err: unknown) => void;
}

/** Writes entries in batches; at most one batch statement in flight. */
export class GroupWriter<T> {
  private pending: Pending<T>[] = [];
  private scheduled: NodeJS.Immediate | undefined;
  private inFlight: Promise<void> | undefined;

  /** `write` answers one boolean per entry, in order: false where the fence refused it. */
  constructor(
    private readonly write: (batch: readonly T[]) => Promise<boolean[]>,
    private readonly maxBatch = 200,
  ) {}

  /** Resolves with whether this entry was written (false: the fence refused it). */
  add(entry: T): Promise<boolean> {
    return new Promise((resolve, reject) => {
      this.pending.push({ entry, resolve, reject });
      this.schedule();
    });
  }

  private schedule(): void {
    if (this.inFlight || this.scheduled) return;
    // setImmediate: entries added in the same turn of the event loop share a batch.
    this.scheduled = setImmediate(() => {
      this.scheduled = undefined;
      this.inFlight = this.flush().finally(() => {
        this.inFlight = undefined;
        if (this.pending.length > 0) this.schedule();
      });
    });
  }

  private async flush(): Promise<void> {
    const batch = this.pending.splice(0, this.maxBatch);
    try {
      const written = await this.write(batch.map((p) => p.entry));
      batch.forEach((p, i) => p.resolve(written[i] ?? false));
    } catch (err) {
      // Every caller retries on its own (transient errors) or reports the failure.
      for (const p of batch) p.reject(err);
    }
  }
}
