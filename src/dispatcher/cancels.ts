/**
 * Cancels reaching the items this fylr holds. A Cancel call on any fylr marks the row and
 * notifies "cancel <id>"; the fylr holding the item stops its task at once (the exec
 * client sends CANCEL to the execserver). Each heartbeat also looks the held items up, in
 * case a notification was missed, and cancels items whose cancel is older than the
 * bound (their fylr is gone, or never confirmed) — so no cancel waits forever.
 */
import type { Events } from "../shared/events.js";
import type { Logger } from "../shared/log.js";
import type { DispatcherEvents } from "./events.js";
import type { ItemControlStore } from "./item-control.js";
import type { ItemTasks } from "./item-tasks.js";

/** What the cancel watch needs. */
export interface CancelWatchDeps {
  readonly control: ItemControlStore;
  readonly tasks: ItemTasks;
  readonly events: Events<DispatcherEvents>;
  readonly log: Logger;
  readonly cancelBoundMs: number;
}

/** Stops held items whose cancel was asked for. */
export class CancelWatch {
  constructor(private readonly deps: CancelWatchDeps) {}

  /** A cancel for `id` was asked (a notification, or a Cancel call on this fylr). */
  requested(id: string): void {
    if (this.deps.tasks.cancel(id)) this.deps.log.info({ itemId: id }, "cancel asked for a held item; stopping it");
  }

  /** The heartbeat's check: held items cancelled meanwhile, and overdue cancels anywhere. */
  async check(): Promise<void> {
    const held = this.deps.tasks.heldIds();
    for (const id of await this.deps.control.cancelledAmong(held)) this.requested(id);
    const overdue = await this.deps.control.cancelOverdue(this.deps.cancelBoundMs);
    if (overdue.length > 0) {
      this.deps.log.warn({ items: overdue, boundMs: this.deps.cancelBoundMs }, "cancelled items whose job was not confirmed stopped within the cancel bound");
    }
  }
}
