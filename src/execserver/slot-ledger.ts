import { randomFillSync } from "node:crypto";
import { Code, SlotbrokerError } from "../shared/errors.js";

/**
 * The slots of one waitgroup as permits: `free = processes − running − offered`.
 * reserve() turns a free slot into an offered one, accept() an offered into a running
 * one, withdraw() and finish() give it back. Each call checks its precondition and throws
 * on misuse, so a bookkeeping bug surfaces at once instead of leaking slots.
 */
export class SlotLedger {
  private runningCount = 0;
  private offeredCount = 0;
  private completedCount = 0;
  private readonly runtimes: RollingMean;

  constructor(
    /** Waitgroup name. */
    readonly name: string,
    /** Number of slots. */
    readonly processes: number,
    runtimeWindow = 100,
  ) {
    this.runtimes = new RollingMean(runtimeWindow);
  }

  /** Slots running a job. */
  get running(): number {
    return this.runningCount;
  }

  /** Slots held by an outstanding offer. */
  get offered(): number {
    return this.offeredCount;
  }

  /** Slots neither running nor offered. */
  get free(): number {
    return this.processes - this.runningCount - this.offeredCount;
  }

  /** Jobs finished since start. */
  get completed(): number {
    return this.completedCount;
  }

  /** Mean runtime of the recent jobs in ms; undefined without history. */
  get meanRuntimeMs(): number | undefined {
    return this.runtimes.mean;
  }

  /** Reserves a free slot for an offer. */
  reserve(): void {
    if (this.free <= 0) throw this.misuse("reserve without a free slot");
    this.offeredCount++;
  }

  /** Turns an offered slot into a running one (the offer was accepted). */
  accept(): void {
    if (this.offeredCount <= 0) throw this.misuse("accept without an offered slot");
    this.offeredCount--;
    this.runningCount++;
  }

  /** Returns an offered slot (declined, expired, withdrawn). */
  withdraw(): void {
    if (this.offeredCount <= 0) throw this.misuse("withdraw without an offered slot");
    this.offeredCount--;
  }

  /** Returns a running slot and records the job's runtime. */
  finish(runtimeMs: number): void {
    if (this.runningCount <= 0) throw this.misuse("finish without a running slot");
    this.runningCount--;
    this.completedCount++;
    this.runtimes.add(runtimeMs);
  }

  private misuse(what: string): SlotbrokerError {
    return new SlotbrokerError(Code.Internal, `slot ledger ${this.name}: ${what}`, {
      details: { processes: this.processes, running: this.runningCount, offered: this.offeredCount },
    });
  }
}

/** The mean of the last `window` samples, in O(1) per sample. */
export class RollingMean {
  private readonly samples: Float64Array;
  private count = 0;
  private next = 0;
  private sum = 0;

  constructor(window: number) {
    this.samples = new Float64Array(Math.max(1, window));
  }

  /** Adds a sample, evicting the oldest once the window is full. */
  add(value: number): void {
    if (this.count === this.samples.length) this.sum -= this.samples[this.next]!;
    else this.count++;
    this.samples[this.next] = value;
    this.sum += value;
    this.next = (this.next + 1) % this.samples.length;
  }

  /** The mean; undefined before the first sample. */
  get mean(): number | undefined {
    return this.count === 0 ? undefined : this.sum / this.count;
  }
}

/**
 * Fresh offer tokens: 128 random bits, base64url. Randomness is drawn from the CSPRNG in
 * 4 KiB batches because one crypto call per offer would dominate the grant path.
 */
export class TokenSource {
  private readonly pool = Buffer.alloc(4096);
  private offset = this.pool.length;

  /** A new, unpredictable token. */
  next(): string {
    if (this.offset + 16 > this.pool.length) {
      randomFillSync(this.pool);
      this.offset = 0;
    }
    const token = this.pool.toString("base64url", this.offset, this.offset + 16);
    this.offset += 16;
    return token;
  }
}
