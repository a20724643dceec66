/** Waiting on streams with the platform's helpers (events.once, stream.finished). */
import { once, type EventEmitter } from "node:events";
import { workOver } from "./abort.js";

/**
 * Resolves on the stream's next 'drain'. Rejects with the stream's error when it errors,
 * or with `closed()` when it closes first. Every listener is removed either way.
 */
export async function drained(stream: EventEmitter, closed: () => Error): Promise<void> {
  const done = new AbortController();
  try {
    // once() rejects on 'error'; the loser of the race is cancelled through the signal.
    await Promise.race([
      once(stream, "drain", { signal: done.signal }),
      once(stream, "close", { signal: done.signal }).then(() => Promise.reject(closed())),
    ]);
  } finally {
    done.abort(workOver);
  }
}
