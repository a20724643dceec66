/**
 * QueueService.List, pure: a filter becomes one parameterised query, newest first, paged by
 * keyset on `seq` (the next page starts below the last row's seq; no OFFSET, so page 1000
 * costs what page 1 costs). Only the filters given become predicates, so each combination
 * is its own prepared statement with a plan that can use its index (migration 0005).
 */
import { Code, SlotbrokerError } from "../../shared/errors.js";
import type { ItemState } from "../types.js";

/** Items per page unless asked otherwise. */
export const defaultPageSize = 50;
/** The most items one page returns; larger requests are capped. */
export const maxPageSize = 500;

/** What to list; every field optional. */
export interface ListFilter {
  readonly states?: readonly ItemState[];
  /** The first exec call's service, or the local action's name. */
  readonly service?: string;
  readonly minPriority?: number;
  readonly maxPriority?: number;
  /** The fairness key ("" the default key). */
  readonly fairnessKey?: string;
  /** Created at or after. */
  readonly createdAfter?: Date;
  /** Created before. */
  readonly createdBefore?: Date;
  readonly pageSize?: number;
  /** The previous page's nextPageToken. */
  readonly pageToken?: string;
}

/** The service an item is listed under: the expression the service index is built on. */
const serviceExpr = "coalesce(payload -> 'calls' -> 0 ->> 'service', payload -> 'local' ->> 'name')";

// Everything but the output bytes: a page of 500 items must not drag 500 outputs along.
const columns = `id, seq, kind, priority, payload, state, claimed_by, lease, start_after, attempts, max_attempts,
  created_at, claimed_at, updated_at, finished_at, result, NULL::bytea AS output, output_blob, output_size,
  output_sha256, error, idempotency_key, cancel_requested_at, fairness_key, fairness_weight, fairness_limit`;

/** Every state, for a listing that filters by none: its pages merge one index range per state. */
const allStates: readonly ItemState[] = ["queued", "claimed", "running", "succeeded", "failed", "cancelled"];

/**
 * The list query for a filter: SQL text, its values, and the page size (one extra row is
 * fetched to tell if there is more). Without a service or key filter the (state, seq) index
 * serves every page: one state is one index range in page order; several states (or none
 * given: all of them) are one range each, merged in page order (there is no index on seq
 * alone, which every state change would have to write).
 */
export function listQuery(filter: ListFilter): { text: string; values: unknown[]; pageSize: number } {
  const where: string[] = [];
  const values: unknown[] = [];
  const param = (value: unknown): string => {
    values.push(value);
    return `$${values.length}`;
  };
  const states = [...new Set(filter.states ?? [])];
  if (filter.service) where.push(`${serviceExpr} = ${param(filter.service)}`);
  if (filter.fairnessKey !== undefined) where.push(`fairness_key = ${param(filter.fairnessKey)}`);
  // Literals of our own list: each branch's plan knows its state.
  const branches = states.length !== 1 && where.length === 0 ? allStates.filter((s) => states.length === 0 || states.includes(s)) : [];
  const merged = branches.length > 0 ? branches : undefined;
  if (states.length === 1) where.push(`state = ${param(states[0])}`);
  else if (states.length > 1 && !merged) where.push(`state = ANY(${param(states)}::text[])`);
  if (filter.minPriority !== undefined) where.push(`priority >= ${param(filter.minPriority)}`);
  if (filter.maxPriority !== undefined) where.push(`priority <= ${param(filter.maxPriority)}`);
  if (filter.createdAfter) where.push(`created_at >= ${param(filter.createdAfter)}`);
  if (filter.createdBefore) where.push(`created_at < ${param(filter.createdBefore)}`);
  if (filter.pageToken) where.push(`seq < ${param(decodePageToken(filter.pageToken))}::bigint`);
  const pageSize = Math.min(Math.max(filter.pageSize || defaultPageSize, 1), maxPageSize);
  const limit = param(pageSize + 1);
  // Each branch ordered and limited on its own: only so does its plan read the index range
  // in order (the planner drops a constant leading column for a query's own quals alone).
  const from = merged
    ? `(${merged.map((state) => `(SELECT * FROM queue_items WHERE ${[`state = '${state}'`, ...where].join(" AND ")} ORDER BY seq DESC LIMIT ${limit})`).join("\n  UNION ALL ")}) AS q`
    : `queue_items${where.length > 0 ? ` WHERE ${where.join(" AND ")}` : ""}`;
  const text = `SELECT ${columns} FROM ${from} ORDER BY seq DESC LIMIT ${limit}`;
  return { text, values, pageSize };
}

/** The token that continues after the row with this seq. */
export function encodePageToken(seq: string | number | bigint): string {
  return Buffer.from(`seq:${String(seq)}`).toString("base64url");
}

/** The seq a page token continues below; INVALID_ARGUMENT for anything not made by encodePageToken. */
export function decodePageToken(token: string): string {
  const text = Buffer.from(token, "base64url").toString("utf8");
  const match = /^seq:(\d{1,19})$/.exec(text);
  if (!match) throw new SlotbrokerError(Code.InvalidArgument, `page_token: not a token from a previous List answer: "${token.slice(0, 64)}"`);
  return match[1]!;
}
