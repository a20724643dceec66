/**
 * Group commit for completions. Items finish one by one, but writing each success in its
 * own statement makes the commit the bottleneck of a busy fylr. Completions that arrive
 * while a batch is being written wait for it and go together in the next one, so one
 * item alone still costs one round trip and a burst costs one round trip per batch. Each
 * entry keeps its own lease fence inside the batch statement.
 */
import type { QueueStore } from "./store.js";
import type { ItemOutput } from "./output-sink.js";
import type { CallResult, Fence } from "./types.js";

interface Entry {
  readonly fence: Fence;
  readonly results: readonly CallResult[];
  readonly output: ItemOutput | undefined;
  readonly resolve: (written: boolean) => void;
  readonly reject: (err: unknown) => void;
}

/** Batches `complete` writes; at most one batch statement in flight. */
export class CompletionBatcher {
  private pending: Entry[] = [];
  private scheduled: NodeJS.Immediate | undefined;
  private inFlight: Promise<void> | undefined;

  constructor(
    private readonly store: QueueStore,
    private readonly maxBatch = 200,
  ) {}

  /** Marks an item succeeded; resolves false when the lease fence refused it. */
  complete(fence: Fence, results: readonly CallResult[], output: ItemOutput | undefined): Promise<boolean> {
    return new Promise((resolve, reject) => {
      this.pending.push({ fence, results, output, resolve, reject });
      this.schedule();
    });
  }

  private schedule(): void {
    if (this.inFlight || this.scheduled) return;
    // setImmediate: completions finishing in the same turn of the event loop share a batch.
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
      const written = await this.store.completeMany(batch);
      batch.forEach((entry, i) => entry.resolve(written[i] ?? false));
    } catch (err) {
      // Every caller retries on its own (transient errors) or reports the failure.
      for (const entry of batch) entry.reject(err);
    }
  }
}
