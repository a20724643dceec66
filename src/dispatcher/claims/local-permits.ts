/**
 * The local-bound semaphore: permits for local actions, sized from the CPU count, with a
 * share that only high-priority items may take. Normal items can never fill the last
 * reserved permits, so an interactive checksum is not stuck behind a batch of them.
 */
import { reservedForHigh } from "./admission.js";

/** A held local slot. Release it in `finally`; releasing twice is a no-op. */
export interface Permit {
  readonly priority: number;
  /** "reserved" until the item starts, then "used"; "released" at the end. */
  readonly state: PermitState;
  /** Marks the permit as carrying a running item (for stats). */
  markUsed(): void;
  /** Returns the slot to the semaphore. */
  release(): void;
}

/** A permit's lifecycle. */
export type PermitState = "reserved" | "used" | "released";

/** Figures of the semaphore. */
export interface PermitCounts {
  readonly capacity: number;
  readonly reservedForHigh: number;
  /** Permits held (reserved or used). */
  readonly held: number;
  /** Permits carrying a running item. */
  readonly used: number;
}

/** The local-bound semaphore. `priority >= highPriority` counts as high. */
export class LocalPermits {
  readonly capacity: number;
  readonly reservedForHigh: number;
  private held = 0;
  private used = 0;
  private readonly waiters: { priority: number; grant: (p: Permit) => void }[] = [];

  constructor(capacity: number, readonly highPriority = 1) {
    if (!Number.isInteger(capacity) || capacity < 1) throw new RangeError(`local capacity must be a positive integer, got ${capacity}`);
    this.capacity = capacity;
    this.reservedForHigh = reservedForHigh(capacity);
  }

  /** Permits an item of this priority could take right now, or once `released` held ones are given back. */
  available(priority: number, released = 0): number {
    const limit = priority >= this.highPriority ? this.capacity : this.capacity - this.reservedForHigh;
    return Math.max(0, limit - Math.max(0, this.held - released));
  }

  /** Takes a permit if one is free for this priority; undefined otherwise. */
  tryReserve(priority: number): Permit | undefined {
    if (this.available(priority) === 0) return undefined;
    return this.grant(priority);
  }

  /** Waits for a permit (FIFO among waiters that fit); rejects when `signal` aborts. */
  reserve(priority: number, signal?: AbortSignal): Promise<Permit> {
    const now = this.waiters.length === 0 ? this.tryReserve(priority) : undefined;
    if (now) return Promise.resolve(now);
    return new Promise((resolve, reject) => {
      if (signal?.aborted) return reject(signal.reason as Error);
      const waiter = {
        priority,
        grant: (p: Permit) => {
          signal?.removeEventListener("abort", onAbort);
          resolve(p);
        },
      };
      const onAbort = (): void => {
        const i = this.waiters.indexOf(waiter);
        if (i >= 0) this.waiters.splice(i, 1);
        reject(signal!.reason as Error);
      };
      signal?.addEventListener("abort", onAbort, { once: true });
      this.waiters.push(waiter);
    });
  }

  /** Current figures. */
  counts(): PermitCounts {
    return { capacity: this.capacity, reservedForHigh: this.reservedForHigh, held: this.held, used: this.used };
  }

  private grant(priority: number): Permit {
    this.held += 1;
    let state: PermitState = "reserved";
    const release = (): void => {
      if (state === "released") return;
      if (state === "used") this.used -= 1;
      state = "released";
      this.held -= 1;
      this.wakeWaiters();
    };
    const markUsed = (): void => {
      if (state !== "reserved") return;
      state = "used";
      this.used += 1;
    };
    return {
      priority,
      get state() {
        return state;
      },
      markUsed,
      release,
    };
  }

  private wakeWaiters(): void {
    for (let i = 0; i < this.waiters.length; ) {
      const waiter = this.waiters[i]!;
      if (this.available(waiter.priority) === 0) {
        i += 1;
        continue;
      }
      this.waiters.splice(i, 1);
      waiter.grant(this.grant(waiter.priority));
    }
  }
}
