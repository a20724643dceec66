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
import { durationFromMs, durationMs, timestampDate, timestampFromDate } from "@bufbuild/protobuf/wkt";

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
