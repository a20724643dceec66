/**
 * Typed lifecycle events: an event map (name → argument tuple), `on` returning the
 * unsubscribe function, one safe `emit` (a throwing listener is reported and the others
 * still run — an observer can never break the engine it watches), and `next()` to await
 * one event. Engines expose one as `events`; status pages, metrics and tests subscribe.
 */

/** An event map: each event's name and the arguments its listeners get. */
export type EventMap<T> = { [K in keyof T]: readonly unknown[] };

type Listener<A extends readonly unknown[]> = (...args: A) => void;

/** Options of Events.next. */
export interface NextOptions<A extends readonly unknown[]> {
  /** Only an event whose arguments pass counts. */
  readonly filter?: (...args: A) => boolean;
  /** Rejects with the signal's reason when it aborts first. */
  readonly signal?: AbortSignal;
}

/** One component's typed events. */
export class Events<M extends EventMap<M>> {
  private readonly listeners = new Map<keyof M, Set<Listener<M[keyof M]>>>();

  /** `onListenerError` hears about a listener that threw (default: ignored). */
  constructor(private readonly onListenerError: (err: unknown, event: keyof M) => void = () => undefined) {}

  /** Calls `listener` on every `event`; returns the function that stops it. */
  on<K extends keyof M>(event: K, listener: Listener<M[K]>): () => void {
    let set = this.listeners.get(event);
    if (!set) this.listeners.set(event, (set = new Set()));
    // A listener registered twice runs twice, like EventEmitter: wrap to keep identities apart.
    const entry: Listener<M[keyof M]> = (...args) => listener(...(args as unknown as M[K]));
    set.add(entry);
    return () => {
      set.delete(entry);
      if (set.size === 0 && this.listeners.get(event) === set) this.listeners.delete(event);
    };
  }

  /** Resolves with the arguments of the next `event` (that passes `filter`). */
  next<K extends keyof M>(event: K, options: NextOptions<M[K]> = {}): Promise<M[K]> {
    const { filter, signal } = options;
    if (signal?.aborted) return Promise.reject(signal.reason as Error);
    return new Promise((resolve, reject) => {
      const stop = this.on(event, (...args) => {
        if (filter && !filter(...args)) return;
        done();
        resolve(args);
      });
      const onAbort = (): void => {
        done();
        reject(signal!.reason as Error);
      };
      const done = (): void => {
        stop();
        signal?.removeEventListener("abort", onAbort);
      };
      signal?.addEventListener("abort", onAbort, { once: true });
    });
  }

  /** True when anyone listens to `event` (skip building costly arguments otherwise). */
  has(event: keyof M): boolean {
    return this.listeners.has(event);
  }

  /** Tells every listener of `event`; a listener that throws is reported, never rethrown. */
  emit<K extends keyof M>(event: K, ...args: M[K]): void {
    const set = this.listeners.get(event);
    if (!set) return;
    // A Set iterates safely while listeners unsubscribe mid-emit; no copy on the hot path.
    for (const listener of set) {
      try {
        listener(...args);
      } catch (err) {
        try {
          this.onListenerError(err, event);
        } catch {
          // The reporter failed too; nothing left to tell.
        }
      }
    }
  }
}
