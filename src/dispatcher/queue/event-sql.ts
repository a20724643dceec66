/**
 * The item timeline's writes, as SQL fragments the statements of sql.ts carry along: each
 * statement that changes an item bumps `queue_items.events` by the number of events it
 * writes and inserts them in CTEs of its own, so an event never costs a round trip.
 * Event n of an item lands in slot (n − 1) % eventCap: an item keeps its latest eventCap
 * events, an older one overwritten in place (migration 0009).
 */

/** Events kept per item. */
export const eventCap = 200;

/** One event's columns as SQL expressions over `from`; absent ones are null. */
export interface EventExpr {
  readonly item: string;
  /** The event's number: the item's `events` after the write, minus the events after this one. */
  readonly n: string;
  readonly kind: string;
  /** Default now(). */
  readonly at?: string;
  readonly fylr?: string;
  readonly attempt?: string;
  readonly execserver?: string;
  readonly service?: string;
  readonly slotWaitMs?: string;
  readonly durationMs?: string;
  readonly exitCode?: string;
  readonly errorKind?: string;
  readonly detail?: string;
  readonly from: string;
  readonly where?: string;
}

/** A SELECT yielding the events of `e`, typed for eventCtes. */
export function eventSelect(e: EventExpr): string {
  const col = (expr: string | undefined, type: string): string => `(${expr ?? "NULL"})::${type}`;
  const columns = [
    col(e.item, "uuid"),
    col(e.n, "integer"),
    col(e.at ?? "now()", "timestamptz"),
    col(e.kind, "text"),
    col(e.fylr, "text"),
    col(e.attempt, "integer"),
    col(e.execserver, "text"),
    col(e.service, "text"),
    col(e.slotWaitMs, "double precision"),
    col(e.durationMs, "double precision"),
    col(e.exitCode, "integer"),
    col(e.errorKind, "text"),
    col(e.detail === undefined ? undefined : `left(${e.detail}, 240)`, "text"),
  ];
  return `SELECT ${columns.join(", ")} FROM ${e.from}${e.where ? ` WHERE ${e.where}` : ""}`;
}

const eventColumns = "item_id, n, at, kind, fylr, attempt, execserver, service, slot_wait_ms, duration_ms, exit_code, error_kind, detail";

/**
 * CTEs writing the events the SELECTs yield: `name` (the events with their slots) and two
 * INSERTs. An event numbered up to eventCap takes a slot never used before (an item's
 * events are numbered under its row lock, by the statement that writes them), so it is a
 * plain insert; only a later one overwrites its slot, by upsert. An upsert costs every row
 * an index probe, a speculative-insertion lock and a second WAL record.
 */
export function eventCtes(name: string, ...selects: string[]): string {
  return `${name} AS (
SELECT e.*, (e.n - 1) % ${eventCap} AS slot
FROM (${selects.join("\n  UNION ALL ")}) AS e(${eventColumns})
), ${name}_new AS (
INSERT INTO item_events (${eventColumns}, slot) SELECT * FROM ${name} WHERE n <= ${eventCap}
), ${name}_over AS (
INSERT INTO item_events (${eventColumns}, slot) SELECT * FROM ${name} WHERE n > ${eventCap}
ON CONFLICT (item_id, slot) DO UPDATE
SET n = excluded.n, at = excluded.at, kind = excluded.kind, fylr = excluded.fylr, attempt = excluded.attempt,
    execserver = excluded.execserver, service = excluded.service, slot_wait_ms = excluded.slot_wait_ms,
    duration_ms = excluded.duration_ms, exit_code = excluded.exit_code, error_kind = excluded.error_kind, detail = excluded.detail
)`;
}

/** How many events the calls of a result (a jsonb expression, as completeItem's $4) write: two per call. */
export function callEventCount(result: string): string {
  return `2 * jsonb_array_length(coalesce(${result} -> 'calls', '[]'::jsonb))`;
}

/**
 * The events of a result's calls — call-started (its slot, the wait for it, the
 * execserver) and call-ended (exit code, error kind, runtime) — numbered from `base` + 1.
 * `row` is the alias of the written item row (id, attempts), `result` the jsonb, `fylr` the
 * fylr that ran them.
 * Times are the running fylr's (CallTiming); a result without them takes now().
 */
export function callEventSelects(row: string, result: string, base: string, fylr: string): string[] {
  const calls = `${row} CROSS JOIN LATERAL jsonb_array_elements(coalesce(${result} -> 'calls', '[]'::jsonb)) WITH ORDINALITY AS c(call, o)`;
  const common = {
    item: `${row}.id`,
    fylr,
    attempt: `${row}.attempts`,
    execserver: `nullif(c.call -> 'receipt' ->> 'instanceId', '')`,
    service: `c.call ->> 'service'`,
    from: calls,
  };
  return [
    eventSelect({
      ...common,
      n: `${base} + 2 * c.o - 1`,
      kind: `'call-started'`,
      at: `coalesce((c.call ->> 'startedAt')::timestamptz, now())`,
      slotWaitMs: `(c.call ->> 'slotWaitMs')::double precision`,
    }),
    eventSelect({
      ...common,
      n: `${base} + 2 * c.o`,
      kind: `'call-ended'`,
      at: `coalesce((c.call ->> 'endedAt')::timestamptz, now())`,
      durationMs: `rtrim(c.call -> 'receipt' ->> 'duration', 's')::double precision * 1000`,
      exitCode: `(c.call -> 'receipt' ->> 'exitCode')::integer`,
      errorKind: `c.call -> 'receipt' ->> 'error'`,
      detail: `coalesce(nullif(c.call -> 'receipt' ->> 'errorMessage', ''), nullif(c.call -> 'receipt' ->> 'signal', ''))`,
    }),
  ];
}

/**
 * The events of a settle — the calls' events, then one closing event — over `row`, the
 * written item row (id, events, attempts), whose `events` already counts them all.
 */
export function settleEventSelects(row: string, result: string, fylr: string, closing: Omit<EventExpr, "item" | "n" | "from" | "fylr">): string[] {
  return [
    ...callEventSelects(row, result, `${row}.events - 1 - ${callEventCount(result)}`, fylr),
    eventSelect({ item: `${row}.id`, n: `${row}.events`, fylr, attempt: `${row}.attempts`, ...closing, from: row }),
  ];
}
