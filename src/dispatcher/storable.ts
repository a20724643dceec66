/**
 * Text from peers made storable in Postgres. A receipt's stderr line or error message is
 * whatever a job or an execserver wrote: a NUL character or a lone UTF-16 surrogate in it
 * is refused by `text` and `jsonb` columns alike, and an outcome that cannot be written
 * would leave its item claimed for as long as the fylr lives. Both become U+FFFD.
 */
// eslint-disable-next-line no-control-regex -- NUL is exactly what must go
const unstorable = /\u0000|[\ud800-\udbff](?![\udc00-\udfff])|(?<![\ud800-\udbff])[\udc00-\udfff]/g;

/** `s` with NUL characters and lone surrogates replaced by U+FFFD. */
export function storableText(s: string): string {
  return s.replace(unstorable, "\ufffd");
}

/** A JSON value with every string (keys included) made storable. */
export function storableJson<T>(value: T): T {
  if (typeof value === "string") return storableText(value) as T;
  if (Array.isArray(value)) return value.map((v: unknown) => storableJson(v)) as T;
  if (value !== null && typeof value === "object") {
    return Object.fromEntries(Object.entries(value).map(([k, v]) => [storableText(k), storableJson(v as unknown)])) as T;
  }
  return value;
}
