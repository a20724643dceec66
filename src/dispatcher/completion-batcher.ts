/**
 * Batched state writes of running items (see group-writer.ts): successes, and the
 * claimed → running mark of exec items whose slot came. A batch of successes that frees
 * exec places may carry the claim those places allow (claim-along.ts).
 */
import type { QueueStore } from "./store.js";
import type { ItemOutput } from "./output-sink.js";
import type { CallResult, ClaimedItem, Fence } from "./types.js";
import { GroupWriter } from "./group-writer.js";
import { completeAndClaim, type ClaimAlong, type Completion } from "./claim-along.js";
import { isTransient } from "./pg-errors.js";

/** A claim booked to ride along with a completion write. */
export interface Boarding extends ClaimAlong {
  /** The write went through with these items claimed. */
  landed(items: readonly ClaimedItem[]): void;
  /** The write failed: nothing was claimed. */
  missed(): void;
}

/** Decides whether a claim goes along with completions that free `freed` exec places. */
export interface ClaimRider {
  board(freed: number): Boarding | undefined;
}

/** Batches `complete` writes. */
export class CompletionBatcher {
  private readonly writer: GroupWriter<Completion>;
  /** Set once the claim pass exists; without it completions go alone. */
  rider: ClaimRider | undefined;

  constructor(store: QueueStore, maxBatch = 200) {
    // A batch of one (the common case below full load) takes the single-row statement: no
    // arrays to build and quote, no unnest; half the fylr's CPU of the write.
    const alone = async (batch: readonly Completion[]): Promise<boolean[]> => {
      const only = batch.length === 1 ? batch[0]! : undefined;
      return only ? [await store.complete(only.fence, only.results, only.output)] : store.completeMany(batch);
    };
    this.writer = new GroupWriter(async (batch) => {
      const freed = batch.reduce((n, e) => n + (e.freePlace ? 1 : 0), 0);
      const boarding = freed > 0 ? this.rider?.board(freed) : undefined;
      if (!boarding) return alone(batch);
      let result;
      try {
        result = await completeAndClaim(store.pool, batch, boarding);
      } catch (err) {
        boarding.missed();
        // Transient: the caller retries. Anything else the claim may have caused must not
        // keep the successes from being written: they go alone.
        if (isTransient(err)) throw err;
        return alone(batch);
      }
      // The written items' places are given up before the claimed ones take them: the
      // admission never counts both.
      for (const e of batch) e.freePlace?.();
      boarding.landed(result.items);
      return result.written;
    }, maxBatch);
  }

  /**
   * Marks an item succeeded; resolves false when the lease fence refused it. An exec item
   * passes `freePlace`: a write that claims along gives its admission place up with it.
   */
  complete(fence: Fence, results: readonly CallResult[], output: ItemOutput | undefined, freePlace?: () => void): Promise<boolean> {
    return this.writer.add({ fence, results, output, freePlace });
  }
}

/** Batches claimed → running writes: one statement (and one notification) per burst. */
export class RunningBatcher {
  private readonly writer: GroupWriter<Fence>;

  constructor(store: QueueStore, maxBatch = 200) {
    this.writer = new GroupWriter((batch) => store.markRunningMany(batch), maxBatch);
  }

  /** claimed → running; resolves false when the lease fence refused it. */
  markRunning(fence: Fence): Promise<boolean> {
    return this.writer.add(fence);
  }
}
