/**
 * Batched state writes of running items (see group-writer.ts): successes, and the
 * claimed → running mark of exec items whose slot came.
 */
import type { QueueStore } from "./store.js";
import type { ItemOutput } from "./output-sink.js";
import type { CallResult, Fence } from "./types.js";
import { GroupWriter } from "./group-writer.js";

interface Completion {
  readonly fence: Fence;
  readonly results: readonly CallResult[];
  readonly output: ItemOutput | undefined;
}

/** Batches `complete` writes. */
export class CompletionBatcher {
  private readonly writer: GroupWriter<Completion>;

  constructor(store: QueueStore, maxBatch = 200) {
    // A batch of one (the common case below full load) takes the single-row statement: no
    // arrays to build and quote, no unnest; half the fylr's CPU of the write.
    this.writer = new GroupWriter(async (batch) => {
      const only = batch.length === 1 ? batch[0]! : undefined;
      return only ? [await store.complete(only.fence, only.results, only.output)] : store.completeMany(batch);
    }, maxBatch);
  }

  /** Marks an item succeeded; resolves false when the lease fence refused it. */
  complete(fence: Fence, results: readonly CallResult[], output: ItemOutput | undefined): Promise<boolean> {
    return this.writer.add({ fence, results, output });
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
