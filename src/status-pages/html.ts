/**
 * A tiny HTML builder for the status pages: the `html` tag escapes every interpolated value
 * unless it is already `Html`, so a client name from the network can never become markup.
 */

/** Markup that is safe to insert as is (built by `html` or `raw`). */
export class Html {
  constructor(readonly value: string) {}

  /** The markup. */
  toString(): string {
    return this.value;
  }
}

const entities: Record<string, string> = { "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;", "`": "&#96;" };

/** Escapes text for element content and quoted attribute values. */
export function escapeHtml(text: string): string {
  return text.replace(/[&<>"'`]/g, (c) => entities[c]!);
}

/** What may be interpolated: text (escaped), numbers, Html, nested lists; nullish and false render nothing. */
export type HtmlValue = Html | string | number | bigint | boolean | null | undefined | readonly HtmlValue[];

function piece(value: HtmlValue): string {
  if (value === null || value === undefined || value === false || value === true) return "";
  if (value instanceof Html) return value.value;
  if (Array.isArray(value)) return (value as readonly HtmlValue[]).map(piece).join("");
  return escapeHtml(String(value));
}

/** Tagged template: literal parts are markup, interpolations are escaped (see HtmlValue). */
export function html(strings: TemplateStringsArray, ...values: readonly HtmlValue[]): Html {
  let out = strings[0]!;
  for (let i = 0; i < values.length; i++) out += piece(values[i]) + strings[i + 1]!;
  return new Html(out);
}

/** Trusted markup (constants of this module only, never data). */
export function raw(markup: string): Html {
  return new Html(markup);
}

/** Joins fragments. */
export function join(parts: readonly HtmlValue[], separator: HtmlValue = ""): Html {
  const sep = piece(separator);
  return new Html(parts.map(piece).join(sep));
}
