/**
 * Conversions between the queue.proto messages and the dispatcher's own types, for
 * QueueService. Kept here so the mapping of every field lives next to the types it maps.
 */
import { create } from "@bufbuild/protobuf";
import {
  CallResultSchema,
  ExecCallSchema,
  HistoryResponseSchema,
  ItemEventKind as ProtoItemEventKind,
  ItemEventSchema,
  InstanceShareSchema,
  ItemKind as ProtoItemKind,
  ItemSchema,
  ItemState as ProtoItemState,
  LocalActionSchema,
  StatsResponseSchema,
  type ExecCall,
  type HistoryResponse,
  type Item,
  type StatsResponse,
  type SubmitRequest,
} from "../../gen/slotbroker/v1/queue_pb.js";
import type { DispatcherStats } from "./dispatcher.js";
import { ErrorKind } from "../../gen/slotbroker/v1/broker_pb.js";
import type { ExecCallSpec, ItemEventKind, ItemHistory, ItemKind, ItemState, QueueItem, StdinSource, SubmitInput } from "./types.js";
import { durationFromMs, durationMs, timestampDate, timestampFromDate, type Timestamp } from "@bufbuild/protobuf/wkt";
import { bail, ended, lenTag, readDuration, tryDecode, varintSize, varintTag, writeVarint, type WireReader } from "../shared/protobuf-wire.js";

const kinds: Record<ItemKind, ProtoItemKind> = { exec: ProtoItemKind.EXEC, local: ProtoItemKind.LOCAL };

const states: Record<ItemState, ProtoItemState> = {
  queued: ProtoItemState.QUEUED,
  claimed: ProtoItemState.CLAIMED,
  running: ProtoItemState.RUNNING,
  succeeded: ProtoItemState.SUCCEEDED,
  failed: ProtoItemState.FAILED,
  cancelled: ProtoItemState.CANCELLED,
};

const statesFromProto = new Map(Object.entries(states).map(([name, value]) => [value, name as ItemState]));

/** The dispatcher's name of a proto state; undefined for UNSPECIFIED or an unknown value. */
export function itemStateFromProto(state: ProtoItemState): ItemState | undefined {
  return statesFromProto.get(state);
}

/** The proto enum value of a state. */
export function itemStateToProto(state: ItemState): ProtoItemState {
  return states[state];
}

function stdinFromProto(call: ExecCall): StdinSource | undefined {
  switch (call.stdin.case) {
    case "stdinData":
      return { kind: "data", data: Buffer.from(call.stdin.value) };
    case "stdinUrl":
      return { kind: "url", url: call.stdin.value };
    case "stdinFromPrevious":
      return call.stdin.value ? { kind: "previous" } : undefined;
    case "stdinUpload":
      return { kind: "upload", id: call.stdin.value };
    default:
      return undefined;
  }
}

/** A SubmitRequest as the dispatcher's SubmitInput (validation happens in submit). */
export function submitInputFromProto(req: SubmitRequest): SubmitInput {
  return {
    calls: req.calls.map(
      (c): ExecCallSpec => ({
        service: c.service,
        args: c.args,
        env: c.env,
        timeoutMs: c.timeout && durationMs(c.timeout),
        stdin: stdinFromProto(c),
      }),
    ),
    local: req.local ? { name: req.local.name, params: req.local.params, input: Buffer.from(req.local.input) } : undefined,
    priority: req.priority,
    startAfter: req.startAfter && timestampDate(req.startAfter),
    idempotencyKey: req.idempotencyKey || undefined,
    maxAttempts: req.maxAttempts || undefined,
    fairnessKey: req.fairnessKey,
    fairnessWeight: req.fairnessWeight || undefined,
    fairnessLimit: req.fairnessLimit || undefined,
  };
}

function stdinToProto(stdin: StdinSource | undefined): ExecCall["stdin"] {
  switch (stdin?.kind) {
    case "data":
      return { case: "stdinData", value: stdin.data };
    case "url":
      return { case: "stdinUrl", value: stdin.url };
    case "previous":
      return { case: "stdinFromPrevious", value: true };
    case "upload":
      return { case: "stdinUpload", value: stdin.id };
    case undefined:
      return { case: undefined };
  }
}

function callToProto(call: ExecCallSpec): ExecCall {
  return create(ExecCallSchema, {
    service: call.service,
    args: [...call.args],
    env: { ...call.env },
    stdin: stdinToProto(call.stdin),
    timeout: call.timeoutMs === undefined ? undefined : durationFromMs(call.timeoutMs),
  });
}

/** A stored item as the proto Item. */
export function itemToProto(item: QueueItem): Item {
  const held = item.state === "claimed" || item.state === "running";
  return create(ItemSchema, {
    id: item.id,
    kind: kinds[item.kind],
    priority: item.priority,
    state: states[item.state],
    calls: item.calls.map(callToProto),
    local: item.local && create(LocalActionSchema, { name: item.local.name, params: { ...item.local.params }, input: item.local.input }),
    claimedBy: held ? (item.claimedBy ?? "") : "",
    attempts: item.attempts,
    maxAttempts: item.maxAttempts,
    startAfter: timestampFromDate(item.startAfter),
    createdAt: timestampFromDate(item.createdAt),
    finishedAt: item.finishedAt && timestampFromDate(item.finishedAt),
    results: item.results.map((r) => create(CallResultSchema, { service: r.service, receipt: r.receipt })),
    output: item.output ?? new Uint8Array(),
    outputSize: BigInt(item.outputSize ?? item.output?.length ?? 0),
    outputSha256: item.outputSha256 ?? "",
    outputStored: item.outputBlob !== undefined,
    error: item.error ?? "",
    idempotencyKey: item.idempotencyKey ?? "",
    cancelRequestedAt: item.cancelRequestedAt && timestampFromDate(item.cancelRequestedAt),
    fairnessKey: item.fairnessKey,
    fairnessWeight: item.fairnessWeight,
    fairnessLimit: item.fairnessLimit ?? 0,
    traceparent: item.traceparent ?? "",
  });
}

const eventKinds: Record<ItemEventKind, ProtoItemEventKind> = {
  submitted: ProtoItemEventKind.SUBMITTED,
  claimed: ProtoItemEventKind.CLAIMED,
  running: ProtoItemEventKind.RUNNING,
  "call-started": ProtoItemEventKind.CALL_STARTED,
  "call-ended": ProtoItemEventKind.CALL_ENDED,
  requeued: ProtoItemEventKind.REQUEUED,
  "cancel-requested": ProtoItemEventKind.CANCEL_REQUESTED,
  cancelled: ProtoItemEventKind.CANCELLED,
  retried: ProtoItemEventKind.RETRIED,
  succeeded: ProtoItemEventKind.SUCCEEDED,
  failed: ProtoItemEventKind.FAILED,
};

/** An item's timeline as the proto HistoryResponse. */
export function historyToProto(history: ItemHistory): HistoryResponse {
  return create(HistoryResponseSchema, {
    eventsDropped: history.dropped,
    events: history.events.map((e) =>
      create(ItemEventSchema, {
        number: e.n,
        at: timestampFromDate(e.at),
        kind: eventKinds[e.kind] ?? ProtoItemEventKind.UNSPECIFIED,
        fylr: e.fylr ?? "",
        attempt: e.attempt ?? 0,
        execserver: e.execserver ?? "",
        service: e.service ?? "",
        slotWait: e.slotWaitMs === undefined ? undefined : durationFromMs(Math.max(0, Math.round(e.slotWaitMs))),
        duration: e.durationMs === undefined ? undefined : durationFromMs(Math.max(0, Math.round(e.durationMs))),
        exitCode: e.exitCode,
        errorKind: e.errorKind === undefined ? ErrorKind.UNSPECIFIED : (ErrorKind[e.errorKind.replace(/^ERROR_KIND_/, "") as keyof typeof ErrorKind] ?? ErrorKind.UNSPECIFIED),
        detail: e.detail ?? "",
      }),
    ),
  });
}

/** Dispatcher stats as the proto StatsResponse. */
export function statsToProto(stats: DispatcherStats): StatsResponse {
  return create(StatsResponseSchema, {
    fylrId: stats.fylrId,
    execHeld: stats.execHeld,
    execAdmission: stats.execAdmission,
    localRunning: stats.localRunning,
    localCapacity: stats.localCapacity,
    shares: stats.shares.map((s) => create(InstanceShareSchema, { ...s })),
    claimedTotal: BigInt(stats.counters.claimed),
    succeededTotal: BigInt(stats.counters.succeeded),
    failedTotal: BigInt(stats.counters.failed),
    requeuedTotal: BigInt(stats.counters.requeued),
    orphansRescuedTotal: BigInt(stats.counters.orphansRescued),
    cancelledTotal: BigInt(stats.counters.cancelled),
  });
}

// --- Item as wire bytes, by hand ------------------------------------------------------
//
// A Submit answers with its item: building the Item message (a create per call and per
// timestamp) and encoding it reflectively was a tenth of a fylr's CPU per Submit. The
// common item (exec, no results yet) is written here directly, field by field in number
// order exactly as protobuf-es's toBinary writes it (unit tests compare the bytes); any
// other item answers undefined and goes the reflective way.

/**
 * The binary Item of `item` (as itemToProto, with inline stdin bytes emptied when
 * `emptyStdinData`), or undefined for an item this encoder leaves to protobuf-es: a local
 * action, call results, or a timeout that is not whole milliseconds.
 */
export function itemToBinary(item: QueueItem, emptyStdinData: boolean): Buffer | undefined {
  if (item.local !== undefined || item.results.length > 0) return undefined;
  const w = new ItemWire(item, emptyStdinData);
  const size = w.measure();
  if (size < 0) return undefined;
  const out = Buffer.allocUnsafe(size);
  const end = w.write(out);
  return end === size ? out : undefined;
}

/** Bytes of the tag of field `n`. */
const tagSize = (n: number): number => (n < 16 ? 1 : 2);
const lenField = (n: number, length: number): number => tagSize(n) + varintSize(length) + length;
const strSize = (n: number, length: number): number => (length === 0 ? 0 : lenField(n, length));
const varintField = (n: number, value: number): number => (value === 0 ? 0 : tagSize(n) + varintSize(value));

function writeTag(out: Buffer, at: number, n: number, wireType: number): number {
  return writeVarint(out, at, (n << 3) | wireType);
}

function writeLen(out: Buffer, at: number, n: number, length: number): number {
  return writeVarint(out, writeTag(out, at, n, 2), length);
}

function writeStr(out: Buffer, at: number, n: number, text: string, length: number, always = false): number {
  if (length === 0 && !always) return at;
  at = writeLen(out, at, n, length);
  return length === 0 ? at : at + out.write(text, at, "utf8");
}

function writeVarintField(out: Buffer, at: number, n: number, value: number): number {
  if (value === 0) return at;
  return writeVarint(out, writeTag(out, at, n, 0), value);
}

// google.protobuf.Timestamp and Duration bodies: seconds (int64), nanos (int32), zeros left out.
function timeBodySize(seconds: number, nanos: number): number {
  return varintField(1, seconds) + varintField(2, nanos);
}

function writeTimeBody(out: Buffer, at: number, seconds: number, nanos: number): number {
  return writeVarintField(out, writeVarintField(out, at, 1, seconds), 2, nanos);
}

function timestampParts(date: Date): [number, number] {
  const ms = date.getTime();
  const seconds = Math.floor(ms / 1000);
  return [seconds, (ms - seconds * 1000) * 1_000_000];
}

/** Sizes first, then bytes: the string lengths measured once are kept for the write. */
class ItemWire {
  private readonly lengths: number[] = [];
  private readonly callSizes: number[] = [];
  private next = 0;

  constructor(
    private readonly item: QueueItem,
    private readonly emptyStdinData: boolean,
  ) {}

  private len(text: string): number {
    const n = Buffer.byteLength(text, "utf8");
    this.lengths.push(n);
    return n;
  }

  private taken(): number {
    return this.lengths[this.next++]!;
  }

  /** The encoded size; -1 when the item is one to leave to protobuf-es. */
  measure(): number {
    const item = this.item;
    const held = item.state === "claimed" || item.state === "running";
    let size = strSize(1, this.len(item.id)) + varintField(2, kinds[item.kind]) + varintField(3, item.priority) + varintField(4, states[item.state]);
    for (const call of item.calls) {
      const body = this.callSize(call);
      if (body < 0) return -1;
      this.callSizes.push(body);
      size += lenField(5, body);
    }
    size += strSize(7, this.len(held ? (item.claimedBy ?? "") : ""));
    size += varintField(8, item.attempts) + varintField(9, item.maxAttempts);
    size += lenField(10, timeBodySize(...timestampParts(item.startAfter)));
    size += lenField(11, timeBodySize(...timestampParts(item.createdAt)));
    if (item.finishedAt) size += lenField(12, timeBodySize(...timestampParts(item.finishedAt)));
    size += strSize(14, item.output?.byteLength ?? 0);
    size += strSize(15, this.len(item.error ?? ""));
    size += strSize(16, this.len(item.idempotencyKey ?? ""));
    size += varintField(17, item.outputSize ?? item.output?.length ?? 0);
    size += strSize(18, this.len(item.outputSha256 ?? ""));
    if (item.outputBlob !== undefined) size += 2 + 1;
    if (item.cancelRequestedAt) size += lenField(20, timeBodySize(...timestampParts(item.cancelRequestedAt)));
    size += strSize(21, this.len(item.fairnessKey));
    size += varintField(22, item.fairnessWeight) + varintField(23, item.fairnessLimit ?? 0);
    size += strSize(35, this.len(item.traceparent ?? ""));
    return size;
  }

  private callSize(call: ExecCallSpec): number {
    let size = strSize(1, this.len(call.service));
    for (const arg of call.args) size += lenField(2, this.len(arg));
    const stdin = call.stdin;
    if (stdin) {
      if (stdin.kind === "data") size += lenField(3, this.emptyStdinData ? 0 : stdin.data.byteLength);
      else if (stdin.kind === "url") size += lenField(4, this.len(stdin.url));
      else if (stdin.kind === "previous") size += 2;
    }
    for (const [name, value] of Object.entries(call.env)) size += lenField(6, lenField(1, this.len(name)) + lenField(2, this.len(value)));
    if (call.timeoutMs !== undefined) {
      const t = call.timeoutMs;
      if (!Number.isSafeInteger(t) || t < 0) return -1;
      size += lenField(7, timeBodySize(Math.floor(t / 1000), (t % 1000) * 1_000_000));
    }
    // stdin_upload is field 8: after env and timeout.
    if (stdin?.kind === "upload") size += lenField(8, this.len(stdin.id));
    return size;
  }

  /** Writes the bytes measure() counted; returns the offset after them. */
  write(out: Buffer): number {
    const item = this.item;
    this.next = 0;
    const held = item.state === "claimed" || item.state === "running";
    let at = writeStr(out, 0, 1, item.id, this.taken());
    at = writeVarintField(out, at, 2, kinds[item.kind]);
    at = writeVarintField(out, at, 3, item.priority);
    at = writeVarintField(out, at, 4, states[item.state]);
    item.calls.forEach((call, i) => (at = this.writeCall(out, at, call, this.callSizes[i]!)));
    at = writeStr(out, at, 7, held ? (item.claimedBy ?? "") : "", this.taken());
    at = writeVarintField(out, at, 8, item.attempts);
    at = writeVarintField(out, at, 9, item.maxAttempts);
    at = writeTimestamp(out, at, 10, item.startAfter);
    at = writeTimestamp(out, at, 11, item.createdAt);
    if (item.finishedAt) at = writeTimestamp(out, at, 12, item.finishedAt);
    const output = item.output;
    if (output && output.byteLength > 0) {
      at = writeLen(out, at, 14, output.byteLength);
      at += output.copy(out, at);
    }
    at = writeStr(out, at, 15, item.error ?? "", this.taken());
    at = writeStr(out, at, 16, item.idempotencyKey ?? "", this.taken());
    at = writeVarintField(out, at, 17, item.outputSize ?? item.output?.length ?? 0);
    at = writeStr(out, at, 18, item.outputSha256 ?? "", this.taken());
    if (item.outputBlob !== undefined) {
      at = writeTag(out, at, 19, 0);
      out[at++] = 1;
    }
    if (item.cancelRequestedAt) at = writeTimestamp(out, at, 20, item.cancelRequestedAt);
    at = writeStr(out, at, 21, item.fairnessKey, this.taken());
    at = writeVarintField(out, at, 22, item.fairnessWeight);
    at = writeVarintField(out, at, 23, item.fairnessLimit ?? 0);
    return writeStr(out, at, 35, item.traceparent ?? "", this.taken());
  }

  private writeCall(out: Buffer, at: number, call: ExecCallSpec, size: number): number {
    at = writeLen(out, at, 5, size);
    at = writeStr(out, at, 1, call.service, this.taken());
    for (const arg of call.args) at = writeStr(out, at, 2, arg, this.taken(), true);
    const stdin = call.stdin;
    if (stdin) {
      if (stdin.kind === "data") {
        const data = this.emptyStdinData ? undefined : stdin.data;
        at = writeLen(out, at, 3, data?.byteLength ?? 0);
        if (data) at += data.copy(out, at);
      } else if (stdin.kind === "url") at = writeStr(out, at, 4, stdin.url, this.taken(), true);
      else if (stdin.kind === "previous") {
        at = writeTag(out, at, 5, 0);
        out[at++] = 1;
      }
    }
    for (const [name, value] of Object.entries(call.env)) {
      const nameLength = this.taken();
      const valueLength = this.taken();
      at = writeLen(out, at, 6, lenField(1, nameLength) + lenField(2, valueLength));
      at = writeStr(out, at, 1, name, nameLength, true);
      at = writeStr(out, at, 2, value, valueLength, true);
    }
    if (call.timeoutMs !== undefined) {
      const t = call.timeoutMs;
      const seconds = Math.floor(t / 1000);
      const nanos = (t % 1000) * 1_000_000;
      at = writeLen(out, at, 7, timeBodySize(seconds, nanos));
      at = writeTimeBody(out, at, seconds, nanos);
    }
    if (stdin?.kind === "upload") at = writeStr(out, at, 8, stdin.id, this.taken(), true);
    return at;
  }
}

function writeTimestamp(out: Buffer, at: number, n: number, date: Date): number {
  const [seconds, nanos] = timestampParts(date);
  at = writeLen(out, at, n, timeBodySize(seconds, nanos));
  return writeTimeBody(out, at, seconds, nanos);
}

// --- SubmitRequest from wire bytes, by hand -------------------------------------------
//
// Every Submit's request decoded reflectively cost about as much as its answer. The common
// request (calls with args, env, stdin and timeout; the scalar fields; start_after) is read
// here into the same message protobuf-es's fromBinary makes; anything else (a local
// action, an unknown field, a sub-message given twice, malformed bytes) answers undefined
// and goes to protobuf-es, which gives its own result or error.

/** The SubmitRequest in `bytes` as fromBinary makes it, or undefined to leave it to protobuf-es. */
export function submitRequestFromBinary(bytes: Uint8Array): SubmitRequest | undefined {
  return tryDecode(bytes, readSubmitRequest);
}

function readSubmitRequest(r: WireReader): SubmitRequest {
  const req: SubmitRequest = {
    $typeName: "slotbroker.v1.SubmitRequest",
    calls: [],
    priority: 0,
    idempotencyKey: "",
    maxAttempts: 0,
    fairnessKey: "",
    fairnessWeight: 0,
    fairnessLimit: 0,
  };
  while (r.pos < r.length) {
    const t = r.tag();
    if (t === lenTag(1)) req.calls.push(readExecCall(r, r.end()));
    else if (t === varintTag(3)) req.priority = r.int32();
    else if (t === lenTag(4) && req.startAfter === undefined) req.startAfter = readTimestamp(r, r.end());
    else if (t === lenTag(5)) req.idempotencyKey = r.string();
    else if (t === varintTag(6)) req.maxAttempts = r.uint32();
    else if (t === lenTag(7)) req.fairnessKey = r.string();
    else if (t === varintTag(8)) req.fairnessWeight = r.uint32();
    else if (t === varintTag(9)) req.fairnessLimit = r.uint32();
    else bail();
  }
  return ended(r, r.length, req);
}

function readExecCall(r: WireReader, end: number): ExecCall {
  const call: ExecCall = { $typeName: "slotbroker.v1.ExecCall", service: "", args: [], stdin: { case: undefined }, env: {} };
  while (r.pos < end) {
    const t = r.tag();
    if (t === lenTag(1)) call.service = r.string();
    else if (t === lenTag(2)) call.args.push(r.string());
    else if (t === lenTag(3)) call.stdin = { case: "stdinData", value: r.bytes() };
    else if (t === lenTag(4)) call.stdin = { case: "stdinUrl", value: r.string() };
    else if (t === varintTag(5)) call.stdin = { case: "stdinFromPrevious", value: r.bool() };
    else if (t === lenTag(8)) call.stdin = { case: "stdinUpload", value: r.string() };
    else if (t === lenTag(6)) readEnvEntry(r, r.end(), call.env);
    else if (t === lenTag(7) && call.timeout === undefined) call.timeout = readDuration(r, r.end());
    else bail();
  }
  return ended(r, end, call);
}

function readEnvEntry(r: WireReader, end: number, env: Record<string, string>): void {
  let key = "";
  let value = "";
  while (r.pos < end) {
    const t = r.tag();
    if (t === lenTag(1)) key = r.string();
    else if (t === lenTag(2) && key === "__proto__") bail();
    else if (t === lenTag(2)) value = r.string();
    else bail();
  }
  ended(r, end, undefined);
  if (key === "__proto__") bail();
  env[key] = value;
}

function readTimestamp(r: WireReader, end: number): Timestamp {
  const ts: Timestamp = { $typeName: "google.protobuf.Timestamp", seconds: 0n, nanos: 0 };
  while (r.pos < end) {
    const t = r.tag();
    if (t === varintTag(1)) ts.seconds = r.int64();
    else if (t === varintTag(2)) ts.nanos = r.int32();
    else bail();
  }
  return ended(r, end, ts);
}
