/**
 * Reads the shape of a config schema: which leaf type a key wants (so environment values
 * are coerced only where a number or boolean is expected) and every key with its default
 * (so the operator guide can be checked against the code).
 */
import type { z } from "zod";

type Def = {
  readonly type: string;
  readonly innerType?: z.core.$ZodType;
  readonly in?: z.core.$ZodType;
  readonly shape?: Record<string, z.core.$ZodType>;
  readonly valueType?: z.core.$ZodType;
  readonly element?: z.core.$ZodType;
  readonly defaultValue?: unknown;
};

const def = (schema: z.core.$ZodType): Def => schema._zod.def;

/** The schema with optional/default/prefault/nullable/pipe wrappers peeled off, plus the default it carries. */
export function unwrapSchema(schema: z.core.$ZodType): { core: z.core.$ZodType; defaultValue: unknown; optional: boolean } {
  let node = schema;
  let defaultValue: unknown;
  let optional = false;
  for (;;) {
    const d = def(node);
    if (d.type === "default" || d.type === "prefault") {
      if (defaultValue === undefined) defaultValue = d.defaultValue;
      node = d.innerType!;
    } else if (d.type === "optional" || d.type === "nullable") {
      optional = true;
      node = d.innerType!;
    } else if (d.type === "pipe") {
      node = d.in!;
    } else {
      return { core: node, defaultValue, optional };
    }
  }
}

/** The leaf type name ("string", "number", "boolean", "array", "object", "record", …) at a dotted path. */
export function schemaTypeAt(schema: z.core.$ZodType, path: readonly string[]): string | undefined {
  let node: z.core.$ZodType | undefined = schema;
  for (const key of path) {
    const d = def(unwrapSchema(node).core);
    node = d.type === "object" ? d.shape?.[key] : d.type === "record" ? d.valueType : undefined;
    if (!node) return undefined;
  }
  return def(unwrapSchema(node).core).type;
}

/** One documented config key. */
export interface SchemaKey {
  /** Dotted path; a record's key is written NAME, e.g. "waitgroups.NAME.processes". */
  readonly path: string;
  /** The leaf type name. */
  readonly type: string;
  /** The default as written in the schema; undefined when there is none. */
  readonly defaultValue: unknown;
}

/**
 * Every key of an object schema, depth first. Objects of plain settings (e.g. `tls`) are
 * listed as one key and also descended into; records become `NAME`.
 */
export function schemaKeys(schema: z.core.$ZodType, prefix = ""): SchemaKey[] {
  const out: SchemaKey[] = [];
  const d = def(unwrapSchema(schema).core);
  const children: [string, z.core.$ZodType][] =
    d.type === "object" ? Object.entries(d.shape ?? {}) : d.type === "record" ? [["NAME", d.valueType!]] : [];
  for (const [key, child] of children) {
    const path = prefix ? `${prefix}.${key}` : key;
    const { core, defaultValue } = unwrapSchema(child);
    const type = def(core).type;
    if (type !== "record") out.push({ path, type, defaultValue });
    if (type === "object" || type === "record") out.push(...schemaKeys(child, path));
  }
  return out;
}
