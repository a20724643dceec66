import { silentLogger, type Logger } from "../../shared/log.js";
import { PipeError } from "./errors.js";
import { InPipe, type InPipeReader, type InPipeSource } from "./in-pipe.js";
import { OutPipe, type OutPipeSink, type OutPipeWriter } from "./out-pipe.js";
import { newPipeId } from "./pipe-id.js";
import type { PipeContext, PipeHandle, PipeSettlement } from "./pipe-state.js";
import { SpentIds, type SpentReason } from "./spent-ids.js";

/** Registry settings; every field has a default. */
export interface PipeRegistryOptions {
  /** How long a pipe waits for its consumer before it expires (default 60 s). */
  readonly ttlMs?: number;
  /** Most spent ids remembered for a 410 answer (default 100,000). */
  readonly spentCapacity?: number;
  /** How long spent ids are remembered (default 10 minutes). */
  readonly spentRetainMs?: number;
  readonly logger?: Logger;
}

/** Per-pipe settings. */
export interface CreatePipeOptions {
  /** Overrides the registry's TTL for this pipe. */
  readonly ttlMs?: number;
}

/** Default time an unused pipe waits before it expires. */
export const DEFAULT_PIPE_TTL_MS = 60_000;

const goneMessages: Record<SpentReason, string> = {
  used: "pipe already used",
  expired: "pipe expired unused",
  cancelled: "pipe was cancelled by its owner",
};

/**
 * The one-time pipes of this fylr replica, in memory. Owners create pipes around a job's
 * stdin source or stdout sink; the HTTP/Connect transports open them by id, once. No
 * sockets here: the transports drive the readers and writers this hands out.
 */
export class PipeRegistry {
  private readonly live = new Map<string, InPipe | OutPipe>();
  private readonly spent: SpentIds;
  private readonly ttlMs: number;
  private readonly logger: Logger;
  private closed = false;

  constructor(options: PipeRegistryOptions = {}) {
    this.ttlMs = options.ttlMs ?? DEFAULT_PIPE_TTL_MS;
    if (!(this.ttlMs > 0)) throw new RangeError(`pipe ttlMs must be > 0, got ${this.ttlMs}`);
    this.spent = new SpentIds({ capacity: options.spentCapacity, retainMs: options.spentRetainMs });
    this.logger = (options.logger ?? silentLogger).child({ component: "pipes" });
  }

  /** A pipe that serves `source` (the job's stdin) to one GET / Read. */
  createInPipe(source: InPipeSource, options: CreatePipeOptions = {}): PipeHandle {
    return this.add((context) => new InPipe(source, context), options);
  }

  /**
   * A pipe whose one PUT / Write streams into `sink` (the job's stdout). Its `done`
   * resolves with the byte count once the sink finished; when the upload is aborted or
   * the pipe expires, `done` rejects and the sink is destroyed with the same PipeError.
   * A function is called for the sink only when the writer arrives: a pipe retired unused
   * never makes one.
   */
  createOutPipe(sink: OutPipeSink, options: CreatePipeOptions = {}): PipeHandle {
    return this.add((context) => new OutPipe(sink, context), options);
  }

  /** Opens in-pipe `id` for its one reader; throws a PipeError (not-found, used, expired, …). */
  openIn(id: string): InPipeReader {
    const pipe = this.lookup(id, "in");
    return (pipe as InPipe).open();
  }

  /** Opens out-pipe `id` for its one writer; throws a PipeError (not-found, used, expired, …). */
  openOut(id: string): OutPipeWriter {
    const pipe = this.lookup(id, "out");
    return (pipe as OutPipe).open();
  }

  /** Pipes waiting or streaming. */
  get size(): number {
    return this.live.size;
  }

  /** Fails every pending pipe (sources and sinks destroyed) and refuses new ones; idempotent. */
  close(reason = "the pipe registry was closed"): void {
    if (this.closed) return;
    this.closed = true;
    const error = new PipeError("closed", reason);
    for (const pipe of [...this.live.values()]) pipe.fail(error);
    this.live.clear();
    this.spent.clear();
  }

  private add(make: (context: PipeContext) => InPipe | OutPipe, options: CreatePipeOptions): PipeHandle {
    if (this.closed) throw new PipeError("closed", "the pipe registry is closed");
    const ttlMs = options.ttlMs ?? this.ttlMs;
    if (!(ttlMs > 0)) throw new RangeError(`pipe ttlMs must be > 0, got ${ttlMs}`);
    const pipe = make({ id: newPipeId(), ttlMs, logger: this.logger, onSettled: (s) => this.settled(s) });
    this.live.set(pipe.id, pipe);
    return pipe;
  }

  private lookup(id: string, direction: "in" | "out"): InPipe | OutPipe {
    if (this.closed) throw new PipeError("closed", "the pipe registry is closed");
    const pipe = this.live.get(id);
    // A pipe of the other direction answers like an unknown one: its id only works on
    // its own route, and the answer must not reveal that the id exists.
    if (pipe && pipe.direction === direction) return pipe;
    const reason = pipe ? undefined : this.spent.get(id);
    if (reason) throw new PipeError(reason === "cancelled" ? "cancelled" : reason, goneMessages[reason]);
    throw new PipeError("not-found", `no such ${direction}-pipe`);
  }

  private settled(settlement: PipeSettlement): void {
    if (this.live.get(settlement.id)?.direction !== settlement.direction) return;
    this.live.delete(settlement.id);
    if (this.closed) return;
    const reason: SpentReason = settlement.state === "expired" ? "expired" : settlement.opened ? "used" : "cancelled";
    this.spent.add(settlement.id, reason);
  }
}
