/**
 * Named (prepared) statements, and a cheaper reading of their rows. Each connection parses
 * and plans a named statement once instead of on every call: the hot claim/complete path
 * runs thousands of times a second.
 *
 * node-postgres makes, for every execution, a row template from the RowDescription (a
 * null-prototype object with one key per column, then copied: a dictionary-mode object, a
 * measurable part of a busy fylr's CPU) and copies it per row, so every row is a slow hash
 * map to read. A named statement's columns are the same on every execution, so here its
 * type parsers are found once and kept with the column names and types they were found
 * for; each row is built by plain property stores, in column order, into an ordinary
 * object. A RowDescription that differs from the kept one (a migration changed a column)
 * replaces it; a column in binary format goes node-postgres's own way. Timestamps in
 * Postgres's usual text form are read directly (timestamptz), anything else by the parser
 * node-postgres would use.
 */
import { createHash } from "node:crypto";
import pg from "pg";

const statementNames = new Map<string, string>();

/** A stable prepared-statement name per query text (pg requires one text per name). */
export function statementName(text: string): string {
  let name = statementNames.get(text);
  if (!name) {
    name = `slotbroker_${createHash("sha1").update(text).digest("hex").slice(0, 16)}`;
    statementNames.set(text, name);
  }
  return name;
}

/** Runs `text` as a named statement on a pooled connection. */
export function namedQuery<R extends pg.QueryResultRow>(pool: pg.Pool, text: string, values: readonly unknown[]): Promise<pg.QueryResult<R>> {
  // pg-pool hands a Submittable to the client with its own callback and resolves with the result.
  return pool.query<R>(new RowQuery(statementName(text), text, values) as unknown as pg.QueryConfig);
}

type Parser = (text: string) => unknown;
interface TypeSource {
  getTypeParser(oid: number, format: "text" | "binary"): Parser;
}

/** The columns of one RowDescription and their parsers. */
class RowShape {
  readonly names: string[];
  readonly oids: number[];
  readonly parsers: Parser[];

  constructor(
    fields: readonly pg.FieldDef[],
    readonly types: TypeSource,
  ) {
    this.names = fields.map((f) => f.name);
    this.oids = fields.map((f) => f.dataTypeID);
    this.parsers = fields.map((f) => textParser(types, f.dataTypeID));
  }

  /** True when `fields` are these columns, in text format, read with `types`. */
  fits(fields: readonly pg.FieldDef[], types: TypeSource): boolean {
    if (types !== this.types || fields.length !== this.names.length) return false;
    for (let i = 0; i < fields.length; i++) {
      const f = fields[i]!;
      if (f.name !== this.names[i] || f.dataTypeID !== this.oids[i] || f.format !== "text") return false;
    }
    return true;
  }

  row(values: readonly (string | null)[]): Record<string, unknown> {
    const row: Record<string, unknown> = {};
    const { names, parsers } = this;
    for (let i = 0; i < names.length; i++) {
      const value = values[i];
      row[names[i]!] = value === null || value === undefined ? null : parsers[i]!(value);
    }
    return row;
  }
}

const shapes = new Map<string, RowShape>();

const TIMESTAMPTZ = 1184;

function textParser(types: TypeSource, oid: number): Parser {
  const parser = types.getTypeParser(oid, "text");
  if (oid !== TIMESTAMPTZ || parser !== pg.types.getTypeParser(TIMESTAMPTZ, "text")) return parser;
  return (text) => parseTimestamptz(text) ?? parser(text);
}

/**
 * A timestamptz as Postgres writes it with DateStyle ISO ("2026-12-07 04:23:11.123456+00",
 * the fraction optional, the offset ±HH or ±HH:MM): the Date node-postgres makes of it, the
 * fraction cut to whole milliseconds. Undefined for any other form (a year outside
 * 1000–9999, BC, infinity, seconds in the offset), which is left to node-postgres's parser.
 */
export function parseTimestamptz(text: string): Date | undefined {
  const n = text.length;
  if (n < 22 || text.charCodeAt(4) !== 45 || text.charCodeAt(7) !== 45 || text.charCodeAt(10) !== 32 || text.charCodeAt(13) !== 58 || text.charCodeAt(16) !== 58) {
    return undefined;
  }
  const year = digits(text, 0, 4);
  const month = digits(text, 5, 2);
  const day = digits(text, 8, 2);
  const hour = digits(text, 11, 2);
  const minute = digits(text, 14, 2);
  const second = digits(text, 17, 2);
  if (year < 1000 || month < 0 || day < 0 || hour < 0 || minute < 0 || second < 0) return undefined;
  let at = 19;
  let ms = 0;
  if (text.charCodeAt(at) === 46) {
    const start = ++at;
    while (at < n && isDigit(text.charCodeAt(at))) at++;
    if (at === start) return undefined;
    // The first three digits are the milliseconds; the rest are cut, as Date.UTC cuts them.
    for (let i = start; i < start + 3; i++) ms = ms * 10 + (i < at ? text.charCodeAt(i) - 48 : 0);
  }
  const sign = text.charCodeAt(at);
  if ((sign !== 43 && sign !== 45) || (n !== at + 3 && (n !== at + 6 || text.charCodeAt(at + 3) !== 58))) return undefined;
  const offsetHours = digits(text, at + 1, 2);
  const offsetMinutes = n === at + 6 ? digits(text, at + 4, 2) : 0;
  if (offsetHours < 0 || offsetMinutes < 0) return undefined;
  const offsetMs = (sign === 45 ? -1 : 1) * (offsetHours * 3600 + offsetMinutes * 60) * 1000;
  return new Date(Date.UTC(year, month - 1, day, hour, minute, second, ms) - offsetMs);
}

function isDigit(code: number): boolean {
  return code >= 48 && code <= 57;
}

// The decimal number of text[at, at + count), or -1 when those are not all digits.
function digits(text: string, at: number, count: number): number {
  let value = 0;
  for (let i = at; i < at + count; i++) {
    const code = text.charCodeAt(i);
    if (!isDigit(code)) return -1;
    value = value * 10 + code - 48;
  }
  return value;
}

// The parts of node-postgres's Query this class takes over (not in its type declarations).
interface QueryInternals {
  name: string;
  _result: pg.QueryResult & { _types: TypeSource };
  _canceledDueToError: unknown;
  _accumulateRows: boolean;
}

/** A named statement whose rows are read through its kept RowShape (exported for tests). */
export class RowQuery extends pg.Query {
  private shape: RowShape | undefined;

  constructor(name: string, text: string, values: readonly unknown[]) {
    // Text and values, not a config object: pg copies a config through its property
    // descriptors, about 5 µs a query, where a string config is made afresh.
    super(text, values);
    (this as unknown as QueryInternals).name = name;
  }

  handleRowDescription(msg: { fields: pg.FieldDef[] }): void {
    const self = this as unknown as QueryInternals;
    const types = self._result._types;
    let shape = shapes.get(self.name);
    if (!shape?.fits(msg.fields, types)) {
      shape = msg.fields.every((f) => f.format === "text") ? new RowShape(msg.fields, types) : undefined;
      if (shape) shapes.set(self.name, shape);
    }
    this.shape = shape;
    if (!shape) return (pg.Query.prototype as unknown as { handleRowDescription(m: unknown): void }).handleRowDescription.call(this, msg);
    self._result.fields = msg.fields;
    self._accumulateRows = true;
  }

  handleDataRow(msg: { fields: (string | null)[] }): void {
    const shape = this.shape;
    if (!shape) return (pg.Query.prototype as unknown as { handleDataRow(m: unknown): void }).handleDataRow.call(this, msg);
    const self = this as unknown as QueryInternals;
    if (self._canceledDueToError) return;
    try {
      self._result.rows.push(shape.row(msg.fields));
    } catch (err) {
      self._canceledDueToError = err;
    }
  }
}
