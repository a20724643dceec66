/**
 * The stored shape of items, pure: submit validation, payload/result JSON and row mapping.
 * Inline bytes travel as base64 inside jsonb; receipts as their canonical protobuf JSON.
 */
import { fromJson, toJson, type JsonValue } from "@bufbuild/protobuf";
import { z } from "zod";
import { ErrorKind, ErrorKindSchema, ReceiptSchema, type Receipt } from "../../../gen/slotbroker/v1/broker_pb.js";
import { Code, SlotbrokerError } from "../../shared/errors.js";
import { isTraceparent } from "../../shared/tracing/trace-context.js";
import { checkArgs, checkEnvSize, checkNoNul } from "../../shared/job-limits.js";
import type { LocalActionRegistry } from "../items/local-actions.js";
import { stdinUrlRefusal } from "./stdin-url.js";
import type { CallResult, CallTiming, ExecCallSpec, ItemKind, ItemState, LocalActionSpec, QueueItem, StdinSource, SubmitInput } from "../types.js";

/** A validated submit, ready for the insert query. */
export interface NormalizedSubmit {
  readonly kind: ItemKind;
  readonly priority: number;
  readonly payload: StoredPayload;
  readonly startAfter: Date | undefined;
  readonly maxAttempts: number;
  readonly idempotencyKey: string | undefined;
  /** Stored in queue_items.traceparent; undefined stores null. */
  readonly traceparent?: string;
  /** The fairness key ("" the default), its weight (1 by default) and per-key limit (unset: none). */
  readonly fairnessKey?: string;
  readonly fairnessWeight?: number;
  readonly fairnessLimit?: number;
  /** Stored uploads the item takes over (stdin_upload ids). */
  readonly uploads?: readonly string[];
}

/** Limits applied at submit time. */
export interface SubmitLimits {
  readonly maxInputBytes: number;
  readonly defaultMaxAttempts: number;
  /** stdin_url must start with one of these; empty allows any http(s) URL. */
  readonly stdinUrlPrefixes?: readonly string[];
}

const maxCalls = 64;
const uuid = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i;
const maxKeyLength = 200;
const int32 = { min: -2_147_483_648, max: 2_147_483_647 };

function invalid(message: string): SlotbrokerError {
  return new SlotbrokerError(Code.InvalidArgument, message);
}

/** Validates a submit; throws INVALID_ARGUMENT naming the bad field. */
export function normalizeSubmit(input: SubmitInput, actions: LocalActionRegistry, limits: SubmitLimits): NormalizedSubmit {
  const calls = input.calls ?? [];
  if (calls.length > 0 && input.local) throw invalid("give either calls or local, not both");
  if (calls.length === 0 && !input.local) throw invalid("give one or more calls, or a local action");
  const priority = input.priority ?? 0;
  if (!Number.isInteger(priority) || priority < int32.min || priority > int32.max) throw invalid(`priority: must be a 32-bit integer, got ${priority}`);
  const maxAttempts = input.maxAttempts || limits.defaultMaxAttempts;
  if (!Number.isInteger(maxAttempts) || maxAttempts < 1 || maxAttempts > 1000) throw invalid(`max_attempts: must be 1…1000, got ${maxAttempts}`);
  const key = input.idempotencyKey || undefined;
  if (key !== undefined && key.length > maxKeyLength) throw invalid(`idempotency_key: longer than ${maxKeyLength} characters`);
  if (key?.includes("\0")) throw invalid("idempotency_key: must not contain a NUL character");
  if (input.startAfter && Number.isNaN(input.startAfter.getTime())) throw invalid("start_after: not a valid time");
  if (input.traceparent !== undefined && !isTraceparent(input.traceparent)) throw invalid("traceparent: not a W3C traceparent");
  const fairness = normalizeFairness(input);
  const common = { priority, startAfter: input.startAfter, maxAttempts, idempotencyKey: key, traceparent: input.traceparent, ...fairness };
  if (input.local) {
    const local = input.local;
    actions.validate(local.name, local.params);
    if (local.input.length > limits.maxInputBytes) {
      throw invalid(`local.input: ${local.input.length} bytes, over the ${limits.maxInputBytes}-byte limit for inline input`);
    }
    return { kind: "local", payload: { local: encodeLocal(local) }, ...common };
  }
  if (calls.length > maxCalls) throw invalid(`calls: at most ${maxCalls} calls per item, got ${calls.length}`);
  let inline = 0;
  calls.forEach((call, i) => {
    inline += validateCall(call, i, limits.stdinUrlPrefixes ?? []);
  });
  if (inline > limits.maxInputBytes) {
    throw invalid(
      `calls: ${inline} bytes of inline stdin, over the ${limits.maxInputBytes}-byte limit (dispatcher.maxInputBytes); upload large input to POST /queue/inputs and pass its id as stdin_upload`,
    );
  }
  const uploads = calls.flatMap((c) => (c.stdin?.kind === "upload" ? [c.stdin.id] : []));
  return { kind: "exec", payload: { calls: calls.map(encodeCall) }, uploads, ...common };
}

/** Longest fairness key, in bytes of UTF-8. */
export const maxFairnessKeyBytes = 128;
/** Largest fairness weight. */
export const maxFairnessWeight = 1000;
/** Largest per-key limit. */
export const maxFairnessLimit = 1_000_000;

function normalizeFairness(input: SubmitInput): { fairnessKey: string; fairnessWeight: number; fairnessLimit: number | undefined } {
  const fairnessKey = input.fairnessKey ?? "";
  if (Buffer.byteLength(fairnessKey, "utf8") > maxFairnessKeyBytes) {
    throw invalid(`fairness_key: longer than ${maxFairnessKeyBytes} bytes of UTF-8 (${Buffer.byteLength(fairnessKey, "utf8")})`);
  }
  if (fairnessKey.includes("\0")) throw invalid("fairness_key: must not contain a NUL character");
  if (/[\ud800-\udbff](?![\udc00-\udfff])|(?<![\ud800-\udbff])[\udc00-\udfff]/.test(fairnessKey)) throw invalid("fairness_key: not valid UTF-16 (a lone surrogate)");
  const fairnessWeight = input.fairnessWeight || 1;
  if (!Number.isInteger(fairnessWeight) || fairnessWeight < 1 || fairnessWeight > maxFairnessWeight) {
    throw invalid(`fairness_weight: must be 1…${maxFairnessWeight}, got ${fairnessWeight}`);
  }
  const fairnessLimit = input.fairnessLimit || undefined;
  if (fairnessLimit !== undefined && (!Number.isInteger(fairnessLimit) || fairnessLimit < 1 || fairnessLimit > maxFairnessLimit)) {
    throw invalid(`fairness_limit: must be 1…${maxFairnessLimit} (0 for none), got ${fairnessLimit}`);
  }
  return { fairnessKey, fairnessWeight, fairnessLimit };
}

function validateCall(call: ExecCallSpec, i: number, stdinUrlPrefixes: readonly string[]): number {
  const at = `calls[${i}]`;
  if (!call.service || call.service.length > 200) throw invalid(`${at}.service: must be a non-empty name`);
  if (call.service.includes("\0")) throw invalid(`${at}.service: must not contain a NUL character`);
  if (call.timeoutMs !== undefined && !(call.timeoutMs > 0)) throw invalid(`${at}.timeout: must be longer than 0`);
  for (const name of Object.keys(call.env)) if (!/^[A-Za-z_][A-Za-z0-9_]*$/.test(name)) throw invalid(`${at}.env: invalid variable name "${name}"`);
  // What an execserver would refuse in the JOB frame is refused here, before it is queued;
  // a NUL cannot be stored in the database's text, nor passed to a process.
  const tooBig = checkArgs(call.args, `${at}.args`) ?? checkEnvSize(call.env, `${at}.env`);
  if (tooBig) throw invalid(`${tooBig} (the execserver's limit)`);
  const nul = checkNoNul(call.args, call.env, at);
  if (nul) throw invalid(nul);
  const stdin = call.stdin;
  if (stdin?.kind === "previous" && i === 0) throw invalid(`${at}.stdin_from_previous: the first call has no previous call`);
  if (stdin?.kind === "upload") {
    if (i !== 0) throw invalid(`${at}.stdin_upload: only the first call may read an upload`);
    if (!uuid.test(stdin.id)) throw invalid(`${at}.stdin_upload: not an upload id (a UUID): "${stdin.id.slice(0, 80)}"`);
  }
  if (stdin?.kind === "url") {
    let url: URL;
    try {
      url = new URL(stdin.url);
    } catch {
      throw invalid(`${at}.stdin_url: not a URL: "${stdin.url}"`);
    }
    if (url.protocol !== "http:" && url.protocol !== "https:") throw invalid(`${at}.stdin_url: must be http(s), got ${url.protocol}`);
    const refused = stdinUrlRefusal(url, stdinUrlPrefixes);
    if (refused) throw invalid(`${at}.stdin_url: ${refused}: "${url.href.slice(0, 200)}"`);
  }
  return stdin?.kind === "data" ? stdin.data.length : 0;
}

// --- payload JSON ---------------------------------------------------------------

const storedStdin = z.union([
  z.strictObject({ data: z.base64() }),
  z.strictObject({ url: z.string() }),
  z.strictObject({ previous: z.literal(true) }),
  z.strictObject({ upload: z.uuid() }),
]);
const storedCall = z.strictObject({
  service: z.string(),
  args: z.array(z.string()),
  env: z.record(z.string(), z.string()),
  timeoutMs: z.number().optional(),
  stdin: storedStdin.optional(),
});
const storedLocal = z.strictObject({ name: z.string(), params: z.record(z.string(), z.string()), input: z.base64() });
const storedPayload = z.union([z.strictObject({ calls: z.array(storedCall) }), z.strictObject({ local: storedLocal })]);

/** The jsonb `payload` column. */
export type StoredPayload = z.infer<typeof storedPayload>;

function encodeStdin(stdin: StdinSource): z.infer<typeof storedStdin> {
  switch (stdin.kind) {
    case "data":
      return { data: stdin.data.toString("base64") };
    case "url":
      return { url: stdin.url };
    case "previous":
      return { previous: true };
    case "upload":
      return { upload: stdin.id };
  }
}

function encodeCall(call: ExecCallSpec): z.infer<typeof storedCall> {
  return {
    service: call.service,
    args: [...call.args],
    env: { ...call.env },
    ...(call.timeoutMs === undefined ? {} : { timeoutMs: call.timeoutMs }),
    ...(call.stdin === undefined ? {} : { stdin: encodeStdin(call.stdin) }),
  };
}

function encodeLocal(local: LocalActionSpec): z.infer<typeof storedLocal> {
  return { name: local.name, params: { ...local.params }, input: local.input.toString("base64") };
}

function decodeStdin(stdin: z.infer<typeof storedStdin>): StdinSource {
  if ("data" in stdin) return { kind: "data", data: Buffer.from(stdin.data, "base64") };
  if ("url" in stdin) return { kind: "url", url: stdin.url };
  if ("upload" in stdin) return { kind: "upload", id: stdin.upload };
  return { kind: "previous" };
}

/** Reads the payload column back; a row that does not parse is reported with its id. */
export function decodePayload(id: string, raw: unknown): { calls: ExecCallSpec[]; local: LocalActionSpec | undefined } {
  const direct = decodeCallsDirectly(raw);
  if (direct) return { calls: direct, local: undefined };
  const parsed = storedPayload.safeParse(raw);
  if (!parsed.success) throw new SlotbrokerError(Code.DataLoss, `queue item ${id}: unreadable payload: ${parsed.error.issues[0]?.message ?? "?"}`);
  const p = parsed.data;
  if ("local" in p) {
    return { calls: [], local: { name: p.local.name, params: p.local.params, input: Buffer.from(p.local.input, "base64") } };
  }
  const calls = p.calls.map(
    (c): ExecCallSpec => ({
      service: c.service,
      args: c.args,
      env: c.env,
      ...(c.timeoutMs === undefined ? {} : { timeoutMs: c.timeoutMs }),
      ...(c.stdin === undefined ? {} : { stdin: decodeStdin(c.stdin) }),
    }),
  );
  return { calls, local: undefined };
}

// An exec payload of the shape encodeCall writes, checked by hand: the schema's generic
// walk was a measurable part of every claim and every submit. Whatever is not plainly that
// shape (a local payload, an odd key, a bad value) returns undefined and is left to the
// schema, which accepts or words the error as before.
function decodeCallsDirectly(raw: unknown): ExecCallSpec[] | undefined {
  if (!isRecord(raw) || !Array.isArray(raw.calls) || Object.keys(raw).length !== 1) return undefined;
  const calls: ExecCallSpec[] = [];
  for (const c of raw.calls as unknown[]) {
    if (!isRecord(c)) return undefined;
    const { service, args, env, timeoutMs, stdin } = c;
    if (typeof service !== "string" || !isStringArray(args) || !isStringRecord(env)) return undefined;
    let keys = 3;
    const call: { -readonly [K in keyof ExecCallSpec]: ExecCallSpec[K] } = { service, args, env };
    if (timeoutMs !== undefined) {
      if (typeof timeoutMs !== "number" || !Number.isFinite(timeoutMs)) return undefined;
      call.timeoutMs = timeoutMs;
      keys++;
    }
    if (stdin !== undefined) {
      const decoded = inlineStdin(stdin) ?? parsedStdin(stdin);
      if (!decoded) return undefined;
      call.stdin = decoded;
      keys++;
    }
    if (Object.keys(c).length !== keys) return undefined;
    calls.push(call);
  }
  return calls;
}

// Inline stdin that is base64 exactly as Buffer writes it (the bytes encode back to the
// same text): the schema's base64 pattern accepts it, and running that pattern over a few
// KiB cost more than decoding them. Anything else is for the schema.
function inlineStdin(stdin: unknown): StdinSource | undefined {
  if (!isRecord(stdin) || typeof stdin.data !== "string" || Object.keys(stdin).length !== 1) return undefined;
  const data = Buffer.from(stdin.data, "base64");
  return data.toString("base64") === stdin.data ? { kind: "data", data } : undefined;
}

function parsedStdin(stdin: unknown): StdinSource | undefined {
  const parsed = storedStdin.safeParse(stdin);
  return parsed.success ? decodeStdin(parsed.data) : undefined;
}

function isRecord(value: unknown): value is Record<string, unknown> {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}

function isStringArray(value: unknown): value is string[] {
  if (!Array.isArray(value)) return false;
  for (const v of value) if (typeof v !== "string") return false;
  return true;
}

// "__proto__" is left to the schema, which copies records key by key.
function isStringRecord(value: unknown): value is Record<string, string> {
  if (!isRecord(value) || Object.hasOwn(value, "__proto__")) return false;
  for (const key in value) if (typeof value[key] !== "string") return false;
  return true;
}

// --- result JSON ----------------------------------------------------------------

/** The jsonb `result` column: the receipts of the latest attempt. */
export function encodeResults(results: readonly CallResult[]): JsonValue {
  return { calls: results.map((r) => ({ service: r.service, receipt: receiptJson(r.receipt), ...(r.timing && encodeTiming(r.timing)) })) };
}

const errorKindNames = new Map(ErrorKindSchema.values.map((v) => [v.number, v.name]));

/**
 * A receipt's canonical protobuf JSON, as toJson writes it (same keys, same order), built
 * directly: the reflective toJson was a measurable part of every completion. A receipt
 * toJson would write differently or refuse (an unknown error kind, a duration out of
 * range) goes through toJson.
 */
export function receiptJson(r: Receipt): JsonValue {
  const d = r.duration;
  const badDuration = d && (d.seconds > 315576000000n || d.seconds < -315576000000n || (d.seconds > 0n && d.nanos < 0) || (d.seconds < 0n && d.nanos > 0));
  const errorName = r.error === ErrorKind.UNSPECIFIED ? undefined : errorKindNames.get(r.error);
  if (badDuration || (r.error !== ErrorKind.UNSPECIFIED && errorName === undefined)) return toJson(ReceiptSchema, r);
  const json: { [key: string]: JsonValue } = {};
  if (r.exitCode !== undefined) json.exitCode = r.exitCode;
  if (r.signal !== "") json.signal = r.signal;
  if (d) json.duration = durationJson(d.seconds, d.nanos);
  if (r.stderrLine !== "") json.stderrLine = r.stderrLine;
  const prefix = r.stdoutPrefix;
  if (prefix.byteLength > 0) json.stdoutPrefix = Buffer.from(prefix.buffer, prefix.byteOffset, prefix.byteLength).toString("base64");
  if (r.stdoutBytes !== 0n) json.stdoutBytes = r.stdoutBytes.toString();
  if (r.stdoutStreamed) json.stdoutStreamed = true;
  if (errorName !== undefined) json.error = errorName;
  if (r.errorMessage !== "") json.errorMessage = r.errorMessage;
  if (r.instanceId !== "") json.instanceId = r.instanceId;
  return json;
}

// google.protobuf.Duration's JSON: seconds with 0, 3, 6 or 9 fraction digits, then "s".
function durationJson(seconds: bigint, nanos: number): string {
  let text = seconds.toString();
  if (nanos !== 0) {
    let digits = String(Math.abs(nanos)).padStart(9, "0");
    if (digits.endsWith("000000")) digits = digits.slice(0, 3);
    else if (digits.endsWith("000")) digits = digits.slice(0, 6);
    text += "." + digits;
    if (nanos < 0 && seconds === 0n) text = "-" + text;
  }
  return text + "s";
}

// Read by the statements that write the call's events (event-sql.ts), not by decodeResults.
function encodeTiming(t: CallTiming): { [key: string]: JsonValue } {
  return { slotWaitMs: t.slotWaitMs, startedAt: t.startedAt.toISOString(), endedAt: t.endedAt.toISOString() };
}

const storedResults = z.object({ calls: z.array(z.object({ service: z.string(), receipt: z.unknown() })) });

/** Reads the result column back. */
export function decodeResults(raw: unknown): CallResult[] {
  if (raw === null || raw === undefined) return [];
  const parsed = storedResults.safeParse(raw);
  if (!parsed.success) return [];
  return parsed.data.calls.map((c) => ({ service: c.service, receipt: fromJson(ReceiptSchema, c.receipt as JsonValue, { ignoreUnknownFields: true }) }));
}

// --- rows -------------------------------------------------------------------------

/** A queue_items row as node-postgres returns it. */
export interface ItemRow {
  id: string;
  kind: ItemKind;
  priority: number;
  payload: unknown;
  state: ItemState;
  claimed_by: string | null;
  lease: string | number;
  start_after: Date;
  attempts: number;
  max_attempts: number;
  created_at: Date;
  claimed_at: Date | null;
  updated_at: Date;
  finished_at: Date | null;
  result: unknown;
  output: Buffer | null;
  output_blob: string | null;
  output_size: string | number | null;
  output_sha256: string | null;
  error: string | null;
  idempotency_key: string | null;
  /** Absent in rows read before migration 0005 ran. */
  cancel_requested_at?: Date | null;
  /** Absent in rows read before migration 0012 ran, and in list pages. */
  traceparent?: string | null;
  /** Absent in rows read before migration 0010 ran. */
  fairness_key?: string;
  fairness_weight?: number;
  fairness_limit?: number | null;
}

/** The columns an insert returns (sql.insertItem, sql.insertQueuedItems). */
export type InsertedRow = Pick<ItemRow, "id" | "state" | "claimed_by" | "lease" | "start_after" | "attempts" | "created_at" | "claimed_at" | "updated_at">;

/**
 * The item a submit inserted: the columns the database decided, the rest as the insert
 * wrote them from `n` (a fresh row has no outcome, output, error or cancel yet).
 */
export function insertedItem(row: InsertedRow, n: NormalizedSubmit): QueueItem {
  // What itemFromRow makes of the row the insert wrote, built directly: no merged row.
  const { calls, local } = decodePayload(row.id, n.payload);
  return {
    id: row.id,
    kind: n.kind,
    priority: n.priority,
    state: row.state,
    calls,
    local,
    claimedBy: row.claimed_by ?? undefined,
    lease: Number(row.lease),
    attempts: row.attempts,
    maxAttempts: n.maxAttempts,
    startAfter: row.start_after,
    createdAt: row.created_at,
    claimedAt: row.claimed_at ?? undefined,
    updatedAt: row.updated_at,
    finishedAt: undefined,
    results: [],
    output: undefined,
    outputBlob: undefined,
    outputSize: undefined,
    outputSha256: undefined,
    error: undefined,
    idempotencyKey: n.idempotencyKey ?? undefined,
    cancelRequestedAt: undefined,
    ...(n.traceparent && { traceparent: n.traceparent }),
    fairnessKey: n.fairnessKey ?? "",
    fairnessWeight: n.fairnessWeight ?? 1,
    fairnessLimit: n.fairnessLimit ?? undefined,
  };
}

/** Maps a row to a QueueItem. */
export function itemFromRow(row: ItemRow): QueueItem {
  const { calls, local } = decodePayload(row.id, row.payload);
  return {
    id: row.id,
    kind: row.kind,
    priority: row.priority,
    state: row.state,
    calls,
    local,
    claimedBy: row.claimed_by ?? undefined,
    lease: Number(row.lease),
    attempts: row.attempts,
    maxAttempts: row.max_attempts,
    startAfter: row.start_after,
    createdAt: row.created_at,
    claimedAt: row.claimed_at ?? undefined,
    updatedAt: row.updated_at,
    finishedAt: row.finished_at ?? undefined,
    results: decodeResults(row.result),
    output: row.output ?? undefined,
    outputBlob: row.output_blob ?? undefined,
    outputSize: row.output_size === null || row.output_size === undefined ? undefined : Number(row.output_size),
    outputSha256: row.output_sha256 ?? undefined,
    error: row.error ?? undefined,
    idempotencyKey: row.idempotency_key ?? undefined,
    cancelRequestedAt: row.cancel_requested_at ?? undefined,
    ...(row.traceparent && { traceparent: row.traceparent }),
    fairnessKey: row.fairness_key ?? "",
    fairnessWeight: row.fairness_weight ?? 1,
    fairnessLimit: row.fairness_limit ?? undefined,
  };
}
