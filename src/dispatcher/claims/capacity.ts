/**
 * The capacity source: which execserver instances this fylr can reach right now.
 *
 * The dispatcher claims exec-bound items only up to its share of the exec capacity it sees,
 * so it needs the fylr's live view of its broker connections. The fylr's broker pool
 * implements this from HELLO frames; tests use `ManualCapacitySource`.
 */

/** One execserver instance this fylr is connected to, as its latest HELLO describes it. */
export interface ExecInstance {
  /** HELLO.instance_id. Two connections reporting the same id are one instance. */
  readonly instanceId: string;
  /** The configured address the instance was reached through (for Stats only). */
  readonly address: string;
  /**
   * Σ HELLO.waitgroups[].processes: all slots of the instance, busy or not. Report 0 while
   * the instance is draining so that no new work is claimed for it.
   */
  readonly capacity: number;
  /** HELLO.clients: broker streams connected to the instance, this fylr's included. */
  readonly clients: number;
}

/**
 * What the dispatcher needs from the fylr's broker pool.
 *
 * Contract for implementers:
 * - `instances()` is cheap and synchronous; it is called on every loop pass (about once a
 *   second) and returns a snapshot. List each instance once (dedupe by instanceId), and
 *   only while a connection to it is up: a disconnected instance must vanish, so that
 *   nothing exec-bound is claimed for capacity the fylr cannot reach.
 * - `subscribe(listener)` calls `listener` (synchronously, with no arguments) after the
 *   snapshot changed: an instance connected or disconnected, or a HELLO changed its
 *   capacity or clients. The dispatcher answers with an extra loop pass; spurious calls
 *   are harmless. It returns the unsubscribe function.
 */
export interface CapacitySource {
  /** The instances this fylr is connected to right now. */
  instances(): readonly ExecInstance[];
  /** Registers a change listener; returns a function that removes it. */
  subscribe(listener: () => void): () => void;
}

/** A CapacitySource whose snapshot is set by hand: for tests and for wiring adapters. */
export class ManualCapacitySource implements CapacitySource {
  private snapshot: readonly ExecInstance[];
  private readonly listeners = new Set<() => void>();

  constructor(instances: readonly ExecInstance[] = []) {
    this.snapshot = [...instances];
  }

  /** The current snapshot. */
  instances(): readonly ExecInstance[] {
    return this.snapshot;
  }

  /** Registers a change listener; returns a function that removes it. */
  subscribe(listener: () => void): () => void {
    this.listeners.add(listener);
    return () => this.listeners.delete(listener);
  }

  /** Replaces the snapshot and tells every listener. */
  set(instances: readonly ExecInstance[]): void {
    this.snapshot = [...instances];
    for (const listener of [...this.listeners]) listener();
  }
}
