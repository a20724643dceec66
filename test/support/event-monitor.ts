/**
 * Awaiting lifecycle events in tests instead of sleeping or polling. A monitor records
 * every occurrence of one event from the moment it is made, so an event that fires before
 * the test gets to `awaitNext` is not missed.
 */
import type { EventMap, Events } from "../../src/shared/typed-events.js";

/** Follows one event of an Events instance. */
export class EventMonitor<M extends EventMap<M>, K extends keyof M> {
  private readonly seen: M[K][] = [];
  private consumed = 0;
  private wake: (() => void) | undefined;
  private readonly stop: () => void;

  constructor(
    events: Events<M>,
    private readonly event: K,
  ) {
    this.stop = events.on(event, (...args) => {
      this.seen.push(args);
      this.wake?.();
    });
  }

  /** How often the event fired since the monitor was made. */
  get count(): number {
    return this.seen.length;
  }

  /** Every occurrence so far, oldest first. */
  get all(): readonly M[K][] {
    return this.seen;
  }

  /**
   * The next occurrence after the ones already taken (that passes `filter`), waiting for it
   * up to `timeoutMs`. Occurrences that do not pass are skipped for good.
   */
  async awaitNext(options: { filter?: (...args: M[K]) => boolean; timeoutMs?: number } = {}): Promise<M[K]> {
    const timeoutMs = options.timeoutMs ?? 10_000;
    const deadline = Date.now() + timeoutMs;
    for (;;) {
      while (this.consumed < this.seen.length) {
        const args = this.seen[this.consumed++]!;
        if (!options.filter || options.filter(...args)) return args;
      }
      await this.more(deadline, timeoutMs);
    }
  }

  /** Waits until the event fired `n` times in all since the monitor was made. */
  async awaitCount(n: number, timeoutMs = 10_000): Promise<void> {
    const deadline = Date.now() + timeoutMs;
    while (this.seen.length < n) await this.more(deadline, timeoutMs);
  }

  // Resolves on the next occurrence; rejects once the deadline passed.
  private async more(deadline: number, timeoutMs: number): Promise<void> {
    const left = deadline - Date.now();
    if (left <= 0) throw new Error(`no "${String(this.event)}" event within ${timeoutMs} ms (saw ${this.seen.length} in all)`);
    await new Promise<void>((resolve) => {
      const timer = setTimeout(resolve, left);
      this.wake = () => {
        clearTimeout(timer);
        this.wake = undefined;
        resolve();
      };
    });
  }

  /** Stops recording. */
  release(): void {
    this.stop();
  }
}

/** Calls `wake` on every event that may change a condition; returns the function that stops it. */
export type WakeSource = (wake: () => void) => () => void;

/** Wakes on any of `names` of an engine's typed events. */
export function eventsOf<M extends EventMap<M>>(events: Events<M>, ...names: (keyof M)[]): WakeSource {
  return (wake) => {
    const stops = names.map((name) => events.on(name, wake));
    return () => stops.forEach((stop) => stop());
  };
}

/** Wakes on any of `names` of a Node EventEmitter. */
export function emitterOf(emitter: NodeJS.EventEmitter, ...names: string[]): WakeSource {
  return (wake) => {
    for (const name of names) emitter.on(name, wake);
    return () => names.forEach((name) => emitter.off(name, wake));
  };
}

/**
 * Resolves with `check()`'s value once it is neither undefined nor false, looking once at
 * the start and again after each event of `sources` (one that came while it looked counts):
 * the condition is re-read exactly when something that can change it happened, never on a
 * timer. Fails naming `what` after `timeoutMs`.
 */
export async function awaitCondition<T>(
  what: string,
  sources: readonly WakeSource[],
  check: () => T | undefined | false | Promise<T | undefined | false>,
  timeoutMs = 15_000,
): Promise<T> {
  let heard = 0;
  let wake: (() => void) | undefined;
  const stops = sources.map((source) =>
    source(() => {
      heard += 1;
      wake?.();
    }),
  );
  const deadline = Date.now() + timeoutMs;
  try {
    for (;;) {
      const before = heard;
      const value = await check();
      if (value !== undefined && value !== false) return value;
      const left = deadline - Date.now();
      if (left <= 0) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}`);
      if (heard !== before) continue;
      await new Promise<void>((resolve) => {
        const timer = setTimeout(resolve, left);
        wake = () => {
          clearTimeout(timer);
          wake = undefined;
          resolve();
        };
      });
    }
  } finally {
    for (const stop of stops) stop();
  }
}
