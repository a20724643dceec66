/**
 * Config parsing shared by every part: value types (durations and byte sizes with units,
 * listen addresses), YAML files, environment overrides, validation into one ConfigError
 * naming each bad key, and reading a schema's shape (for env coercion and the docs check).
 * Each part's own config.ts builds its section's schema from these.
 */
import { readFileSync } from "node:fs";
import { parse as parseYaml } from "yaml";
import { z } from "zod";
import { parseDuration } from "./duration.js";
import { ConfigError } from "./errors.js";

/** A duration string with a unit ("5s", "250ms"), compiled to milliseconds. */
export const durationMs = z.string().transform((text, ctx) => {
  const ms = parseDuration(text);
  if (ms === undefined) {
    ctx.addIssue({ code: "custom", message: `expected a duration with a unit such as "5s" or "250ms", got "${text}"` });
    return z.NEVER;
  }
  return ms;
});

const byteUnits: Record<string, number> = { "": 1, b: 1, kb: 1e3, mb: 1e6, gb: 1e9, tb: 1e12, kib: 2 ** 10, mib: 2 ** 20, gib: 2 ** 30, tib: 2 ** 40 };

/** Parses "64KiB", "10 GB", "1048576" into bytes; undefined when it is not a size. */
export function parseByteSize(text: string): number | undefined {
  const m = /^\s*(\d+(?:\.\d+)?)\s*([a-z]*)\s*$/i.exec(text);
  const unit = m && byteUnits[m[2]!.toLowerCase()];
  if (!m || unit === undefined || unit === null) return undefined;
  const bytes = Math.round(Number(m[1]) * unit);
  return Number.isSafeInteger(bytes) ? bytes : undefined;
}

/** A byte size: a number, or a string with a unit ("64KiB", "10GiB", "500MB"). */
export const byteSize = z.union([z.number().int().nonnegative(), z.string()]).transform((value, ctx) => {
  const bytes = typeof value === "number" ? value : parseByteSize(value);
  if (bytes === undefined) {
    ctx.addIssue({ code: "custom", message: `expected a size such as 65536, "64KiB" or "10GiB", got "${String(value)}"` });
    return z.NEVER;
  }
  return bytes;
});

/** A "host:port" listen address; port 0 picks a free port. IPv6 hosts go in brackets. */
export const listenAddress = z.string().refine((text) => splitHostPort(text) !== undefined, {
  message: 'expected "host:port", e.g. "127.0.0.1:7600" or "[::1]:7600"',
});

/** Splits "host:port" / "[v6]:port"; undefined when malformed. */
export function splitHostPort(text: string): { host: string; port: number } | undefined {
  const m = /^(?:\[([^\]]+)\]|([^:[\]]+)):(\d{1,5})$/.exec(text);
  if (!m) return undefined;
  const port = Number(m[3]);
  if (port > 65535) return undefined;
  return { host: (m[1] ?? m[2])!, port };
}

/** True for 127.0.0.0/8, ::1, localhost and unix sockets: addresses only this host reaches. */
export function isLoopbackHost(host: string): boolean {
  return host === "localhost" || host === "::1" || /^127\.\d+\.\d+\.\d+$/.test(host);
}

/** Reads a YAML file into plain data, naming the file when it cannot be read or parsed. */
export function readYamlFile(path: string): unknown {
  let text: string;
  try {
    text = readFileSync(path, "utf8");
  } catch (err) {
    throw new ConfigError(`cannot read config file ${path}: ${(err as Error).message}`, { cause: err });
  }
  try {
    return parseYaml(text) ?? {};
  } catch (err) {
    throw new ConfigError(`${path}: invalid YAML: ${(err as Error).message}`, { cause: err });
  }
}

/**
 * Copies environment variables onto a raw config object before validation.
 * `mapping` is env name → dotted key path, e.g. { SLOTBROKER_TOKEN: "token" }. A value is
 * converted only where `schema` wants a number, a boolean, an array or an object there, so
 * SLOTBROKER_TOKEN=123456 stays the string "123456".
 */
export function applyEnvOverrides(
  raw: unknown,
  env: NodeJS.ProcessEnv,
  mapping: Record<string, string>,
  schema: z.core.$ZodType,
): Record<string, unknown> {
  const out: Record<string, unknown> =
    typeof raw === "object" && raw !== null && !Array.isArray(raw) ? structuredClone(raw as Record<string, unknown>) : {};
  for (const [name, path] of Object.entries(mapping)) {
    const value = env[name];
    if (value === undefined || value === "") continue;
    const keys = path.split(".");
    let node: Record<string, unknown> = out;
    for (const key of keys.slice(0, -1)) {
      const next = node[key];
      if (typeof next !== "object" || next === null) node[key] = {};
      node = node[key] as Record<string, unknown>;
    }
    node[keys[keys.length - 1]!] = coerceEnvValue(value, schemaTypeAt(schema, keys));
  }
  return out;
}

// A value that does not convert stays a string, so validation names the key and the value.
function coerceEnvValue(value: string, wanted: string | undefined): unknown {
  if (wanted === "number" && /^-?\d+(\.\d+)?$/.test(value)) return Number(value);
  if (wanted === "boolean" && (value === "true" || value === "false")) return value === "true";
  if (wanted === "array" || wanted === "object" || wanted === "record") {
    try {
      return JSON.parse(value) as unknown;
    } catch {
      return value;
    }
  }
  return value;
}

/**
 * Validates raw config against a schema. The first problems are reported in one
 * ConfigError whose message names each bad key by its dotted path.
 */
export function parseConfig<S extends z.ZodType>(schema: S, raw: unknown, source: string): z.output<S> {
  const result = schema.safeParse(raw);
  if (result.success) return result.data;
  throw new ConfigError(`${source}: ${describeIssues(result.error.issues)}`);
}

/** Renders zod issues as "key.path: reason; other.key: reason". */
export function describeIssues(issues: readonly z.core.$ZodIssue[]): string {
  return issues
    .slice(0, 5)
    .map((issue) => {
      const path = issue.path.map(String).join(".");
      if (issue.code === "unrecognized_keys") {
        const keys = issue.keys.map((k) => (path ? `${path}.${k}` : k));
        return `unknown key${keys.length > 1 ? "s" : ""} ${keys.map((k) => `"${k}"`).join(", ")}`;
      }
      return `${path || "(top level)"}: ${issue.message}`;
    })
    .join("; ");
}

// --- the shape of a schema -----------------------------------------------------------
//
// Reads the shape of a config schema: which leaf type a key wants (so environment values
// are coerced only where a number or boolean is expected) and every key with its default
// (so the operator guide can be checked against the code).

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
