/**
 * Control over stored items: cancel, list, retry, delete — the queue-store side. Every call is
 * one statement (see sql.ts), so concurrent calls on the same item, a claim or a
 * completion are ordered by the row lock and each sees the others' result.
 */
import type pg from "pg";
import { Code, SlotbrokerError } from "../../shared/errors.js";
import { encodePageToken, listQuery, type ListFilter } from "./item-list.js";
import { itemFromRow, type ItemRow } from "./payload.js";
import { fromPgError } from "./pg-errors.js";
import * as sql from "./sql.js";
import { checkItemId } from "./queue-store.js";
import { namedQuery } from "./named-query.js";
import type { ItemEvent, ItemEventKind, ItemHistory, ItemState, QueueItem } from "../types.js";

/** What Cancel did. */
export interface CancelResult {
  readonly item: QueueItem;
  /** The state before this call ("cancelled" for a repeat). */
  readonly previous: ItemState;
}

/** One page of List. */
export interface ItemPage {
  readonly items: readonly QueueItem[];
  /** Empty on the last page. */
  readonly nextPageToken: string;
}

const finished: readonly ItemState[] = ["succeeded", "failed", "cancelled"];

/** Cancel, list, retry and delete over the queue's tables. */
export class ItemControlStore {
  constructor(private readonly pool: pg.Pool) {}

  private async query<R extends pg.QueryResultRow>(what: string, text: string, params: unknown[] = []): Promise<pg.QueryResult<R>> {
    try {
      return await namedQuery<R>(this.pool, text, params);
    } catch (err) {
      throw fromPgError(err, what);
    }
  }

  /**
   * Cancels an item: queued or claimed → cancelled now; running → cancel requested (its fylr
   * is notified and stops the job). A cancelled item is returned as it is. NOT_FOUND for an
   * unknown id, FAILED_PRECONDITION naming the state of a succeeded or failed one.
   */
  async cancel(id: string): Promise<CancelResult> {
    checkItemId(id);
    const row = (await this.query<ItemRow & { previous_state: ItemState }>("cancel", sql.cancelItem, [id])).rows[0];
    if (row) return { item: itemFromRow(row), previous: row.previous_state };
    const item = await this.current(id);
    if (item.state === "cancelled") return { item, previous: "cancelled" };
    throw new SlotbrokerError(Code.FailedPrecondition, `item ${id} is ${item.state}: only a queued, claimed or running item can be cancelled`);
  }

  /** A page of items, newest first. */
  async list(filter: ListFilter): Promise<ItemPage> {
    const { text, values, pageSize } = listQuery(filter);
    const rows = (await this.query<ItemRow & { seq: string }>("list", text, values)).rows;
    const page = rows.slice(0, pageSize);
    const more = rows.length > pageSize;
    return { items: page.map(itemFromRow), nextPageToken: more ? encodePageToken(page[page.length - 1]!.seq) : "" };
  }

  /** A failed or cancelled item back to the queue with fresh attempts. */
  async retry(id: string): Promise<QueueItem> {
    checkItemId(id);
    const row = (await this.query<ItemRow>("retry", sql.retryItem, [id])).rows[0];
    if (row) return itemFromRow(row);
    const item = await this.current(id);
    throw new SlotbrokerError(Code.FailedPrecondition, `item ${id} is ${item.state}: only a failed or cancelled item can be retried`);
  }

  /** Removes a finished item and the stored data it owns; returns how many blobs went with it. */
  async delete(id: string): Promise<{ blobs: number }> {
    checkItemId(id);
    const row = (await this.query<{ items: number; blobs: number }>("delete", sql.deleteItem, [id])).rows[0];
    if (row && row.items > 0) return { blobs: row.blobs };
    const item = await this.current(id);
    const verb = finished.includes(item.state) ? "was changed meanwhile" : `is ${item.state}`;
    throw new SlotbrokerError(Code.FailedPrecondition, `item ${id} ${verb}: only a finished (succeeded, failed or cancelled) item can be deleted; cancel it first`);
  }

  /** An item's timeline, oldest first; NOT_FOUND for an unknown id. */
  async history(id: string): Promise<ItemHistory> {
    checkItemId(id);
    const rows = (await this.query<EventRow>("history", sql.selectItemEvents, [id])).rows;
    if (rows.length === 0) throw new SlotbrokerError(Code.NotFound, `item ${id} not found`);
    const events = rows.filter((r) => r.n !== null).map(eventFromRow);
    return { events, dropped: Math.max(0, rows[0]!.total - events.length) };
  }

  /** Held items whose cancel is older than `boundMs`: cancelled now. Returns their ids. */
  async cancelOverdue(boundMs: number): Promise<string[]> {
    return (await this.query<{ id: string }>("cancel overdue", sql.cancelOverdue, [boundMs])).rows.map((r) => r.id);
  }

  /** Of `ids`, those cancelled or with a cancel pending. */
  async cancelledAmong(ids: readonly string[]): Promise<string[]> {
    if (ids.length === 0) return [];
    return (await this.query<{ id: string }>("cancelled among", sql.cancelledAmong, [ids])).rows.map((r) => r.id);
  }

  private async current(id: string): Promise<QueueItem> {
    const row = (await this.query<ItemRow>("get", sql.selectItem, [id])).rows[0];
    if (!row) throw new SlotbrokerError(Code.NotFound, `item ${id} not found`);
    return itemFromRow(row);
  }
}

interface EventRow {
  total: number;
  n: number | null;
  at: Date;
  kind: ItemEventKind;
  fylr: string | null;
  attempt: number | null;
  execserver: string | null;
  service: string | null;
  slot_wait_ms: number | null;
  duration_ms: number | null;
  exit_code: number | null;
  error_kind: string | null;
  detail: string | null;
}

function eventFromRow(r: EventRow): ItemEvent {
  return {
    n: r.n!,
    at: r.at,
    kind: r.kind,
    fylr: r.fylr ?? undefined,
    attempt: r.attempt ?? undefined,
    execserver: r.execserver ?? undefined,
    service: r.service ?? undefined,
    slotWaitMs: r.slot_wait_ms ?? undefined,
    durationMs: r.duration_ms ?? undefined,
    exitCode: r.exit_code ?? undefined,
    errorKind: r.error_kind ?? undefined,
    detail: r.detail ?? undefined,
  };
}
