/**
 * LISTEN on the queue's notification channel (see migrations/0002_notify.sql) over a
 * connection of its own, outside the pool, kept open for the dispatcher's lifetime and
 * reconnected with the retry policy when it drops. Only wakes things up: whatever it
 * misses while reconnecting, the dispatcher's poll and Watch's poll still find.
 */
import { once } from "node:events";
import type pg from "pg";
import { sleep } from "../../shared/abort.js";
import { Events } from "../../shared/typed-events.js";
import type { Logger } from "../../shared/log.js";
import { retryDelayMs, type RetryPolicy } from "../../shared/retry.js";

/** The channel the queue's triggers notify. */
export const queueChannel = "slotbroker_queue";

/** What a notification (or the listening connection) says. */
export interface QueueListenerEvents {
  /** Some item became queued (submit, retry, requeue, sweep): claim loops wake up. */
  queued: [];
  /** Besides "queued": one of those items is local (migration 0007 and later). */
  "queued:local": [];
  /** This item's state changed. */
  changed: [itemId: string];
  /** A cancel was asked for this held item: the fylr holding it stops it. */
  cancel: [itemId: string];
  /** LISTEN is in place (again): notifications may have been missed before it. */
  up: [];
  /** The listening connection failed; it reconnects. */
  down: [error: Error];
}

const reconnect: RetryPolicy = { initialMs: 100, maxMs: 5000, jitter: 0.5 };

/** One LISTEN connection. */
export class QueueListener {
  /** Notifications and the connection's ups and downs. */
  readonly events: Events<QueueListenerEvents>;
  private readonly stop = new AbortController();
  private running: Promise<void> | undefined;
  private listening = false;

  constructor(
    /** Makes a new, unconnected client (the pool's settings, a connection of its own). */
    private readonly newClient: () => pg.Client,
    private readonly log: Logger,
  ) {
    this.events = new Events((err, event) => log.error({ err, event }, "a queue listener event listener threw"));
  }

  /** True while LISTEN is in place. */
  get up(): boolean {
    return this.listening;
  }

  /** Connects and listens until close(). */
  start(): void {
    this.running ??= this.run(this.stop.signal);
  }

  /** Stops listening and closes the connection. Idempotent. */
  async close(): Promise<void> {
    this.stop.abort();
    await this.running;
  }

  private async run(signal: AbortSignal): Promise<void> {
    for (let failures = 0; !signal.aborted; ) {
      const client = this.newClient();
      // An idle client's error must have a listener, or Node ends the process.
      client.on("error", () => undefined);
      client.on("notification", (message) => this.onNotification(message.payload ?? ""));
      try {
        await client.connect();
        await client.query(`LISTEN ${queueChannel}`);
        failures = 0;
        this.listening = true;
        this.events.emit("up");
        // Until the connection ends ('error' rejects) or we are told to stop.
        await once(client, "end", { signal });
        throw new Error("the LISTEN connection ended");
      } catch (err) {
        if (signal.aborted) break;
        failures += 1;
        const error = err instanceof Error ? err : new Error(String(err));
        this.listening = false;
        this.events.emit("down", error);
        // Staged: the first failure is worth a warning, a long outage not one per attempt.
        this.log[failures === 1 || failures % 30 === 0 ? "warn" : "debug"]({ err: error.message, failures }, "queue LISTEN connection down; reconnecting");
      } finally {
        this.listening = false;
        client.removeAllListeners("notification");
        await client.end().catch(() => undefined);
      }
      await sleep(retryDelayMs(reconnect, failures - 1), signal).catch(() => undefined);
    }
  }

  private onNotification(payload: string): void {
    if (payload === "queued") return this.events.emit("queued");
    if (payload === "queued local") return this.events.emit("queued:local");
    if (payload.startsWith("cancel ")) {
      const id = payload.slice("cancel ".length);
      this.events.emit("cancel", id);
      // Watchers see cancel_requested_at even though the state did not change yet.
      return this.events.emit("changed", id);
    }
    if (!payload.startsWith("changed ")) return;
    for (const id of payload.slice("changed ".length).split(",")) if (id) this.events.emit("changed", id);
  }
}
