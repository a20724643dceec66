/**
 * Runs one claimed item and says how it went; the dispatcher turns the Outcome into the
 * fenced write. Exec calls run in order, each one's stdin inline, by URL, from a stored
 * upload, or the previous call's stdout; the last stdout is the output. Stdout streams
 * into an OutputSink (memory while small, the store past that), so no output of any size
 * is ever held whole; a chained call reads its predecessor's stdout back from the store.
 */
import type { Readable } from "node:stream";
import { finished } from "node:stream/promises";
import type { Receipt } from "../../../gen/slotbroker/v1/broker_pb.js";
import { ErrorKind } from "../../../gen/slotbroker/v1/broker_pb.js";
import { Code, SlotbrokerError, isAbortError } from "../../shared/errors.js";
import { receiptSucceeded } from "../../shared/receipt.js";
import { StoreLimitError, type BlobStore } from "../blobs/blob-store.js";
import type { ExecBackend, ExecResult } from "./exec-backend.js";
import type { LiveItems } from "./live.js";
import type { LocalActionRegistry } from "./local-actions.js";
import { CallTrace, type ItemTrace } from "./item-trace.js";
import { inlineOutput, OutputSink, readOutput, type ItemOutput } from "../blobs/output-sink.js";
import type { CallResult, ExecCallSpec, QueueItem } from "../types.js";

/** How an attempt ended. */
export type Outcome =
  | { readonly kind: "succeeded"; readonly results: readonly CallResult[]; readonly output: ItemOutput }
  /** `permanent`: retrying cannot help (output over the limit, action gone), fail now. */
  | { readonly kind: "failed"; readonly results: readonly CallResult[]; readonly error: string; readonly permanent: boolean }
  /** The backend got no slot in time (an error of code RESOURCE_EXHAUSTED). */
  | { readonly kind: "no-slot"; readonly error: SlotbrokerError }
  /** The signal aborted; `reason` is the signal's reason, `results` the receipts of calls that ran (a stopped one's too). */
  | { readonly kind: "aborted"; readonly reason: unknown; readonly results: readonly CallResult[] };

/** What the runner needs from the dispatcher. */
export interface RunnerDeps {
  readonly backend: ExecBackend;
  readonly actions: LocalActionRegistry;
  readonly live: LiveItems;
  /** Where stored inputs are read from and large outputs go. */
  readonly blobs: BlobStore;
  /** Exec outputs up to this size stay in memory and in the item row (store.inlineBytes). */
  readonly inlineBytes: number;
  /** Most output a local action may return (dispatcher.maxOutputBytes). */
  readonly maxOutputBytes: number;
  /** Called once when the item starts running (first slot granted, or the local action begins). */
  readonly onStart: () => void;
  /** The attempt's trace, when traced: each exec call gets a span in it. */
  readonly trace?: ItemTrace;
}

/** Runs an item of either kind. Never rejects. */
export function runItem(item: QueueItem, deps: RunnerDeps, signal: AbortSignal): Promise<Outcome> {
  return item.kind === "exec" ? runExec(item, deps, signal) : runLocal(item, deps, signal);
}

async function runExec(item: QueueItem, deps: RunnerDeps, signal: AbortSignal): Promise<Outcome> {
  const results: CallResult[] = [];
  let previous: ItemOutput | undefined;
  const last = item.calls.length - 1;
  try {
    for (const [i, call] of item.calls.entries()) {
      signal.throwIfAborted();
      const at = `calls[${i}] (${call.service})`;
      deps.live.setPhase(item.id, item.lease, "waiting", { callIndex: i, service: call.service });
      const stdin = await resolveStdin(call, previous, deps.blobs);
      if (typeof stdin === "string") return { kind: "failed", results, error: `${at}: ${stdin}`, permanent: true };
      // Made only when the job streams its stdout, or it is over the inline size: most
      // outputs come whole with the receipt.
      let sink: OutputSink | undefined;
      const makeSink = (): OutputSink => {
        if (sink) return sink;
        sink = new OutputSink(deps.blobs, { role: i === last ? "output" : "intermediate", itemId: item.id, inlineBytes: deps.inlineBytes });
        sink.on("error", () => undefined); // reported through storeError and the receipt
        return sink;
      };
      let ran: ExecResult;
      const traced = deps.trace && new CallTrace(deps.trace.context, item, i, call.service);
      const wantedAt = Date.now();
      let startedAt: Date | undefined;
      try {
        ran = await deps.backend.run(
          { service: call.service, args: call.args, env: call.env, timeoutMs: call.timeoutMs, stdin, traceparent: traced?.traceparent },
          {
            priority: item.priority,
            fairnessKey: item.fairnessKey,
            fairnessWeight: item.fairnessWeight,
            signal,
            stdout: makeSink,
            maxStdoutBytes: deps.inlineBytes,
            onPosition: (position) => {
              traced?.position(position);
              deps.live.setPosition(item.id, item.lease, position);
            },
            onStart: (instanceId, waitgroup) => {
              traced?.started(instanceId, waitgroup);
              startedAt = new Date();
              deps.live.setPhase(item.id, item.lease, "running", { instanceId });
              deps.onStart();
            },
          },
        );
        traced?.done(ran);
      } catch (err) {
        traced?.failed(err);
        sink?.destroy();
        if (sink?.storeError instanceof StoreLimitError) return { kind: "failed", results, error: `${at}: stdout: ${sink.storeError.message}`, permanent: true };
        throw err;
      }
      const { receipt } = ran;
      const endedAt = new Date();
      const timing = startedAt && { slotWaitMs: startedAt.getTime() - wantedAt, startedAt, endedAt };
      results.push({ service: call.service, receipt, timing });
      // The previous call's stdout was this call's stdin: used up.
      discard(deps.blobs, previous);
      previous = undefined;
      const output = !receiptSucceeded(receipt)
        ? undefined
        : !sink && ran.stdout.length <= Math.min(deps.inlineBytes, deps.blobs.config.maxItemBytes)
          ? inlineOutput(ran.stdout)
          : await collect(makeSink(), ran.stdout);
      if (sink?.storeError) {
        discard(deps.blobs, output);
        return { kind: "failed", results, error: `${at}: stdout: ${sink.storeError.message}`, permanent: sink.storeError instanceof StoreLimitError };
      }
      if (!output) {
        sink?.destroy();
        discard(deps.blobs, sink?.output);
        // A job that finished despite an abort keeps its result; one the abort cut short is
        // given back rather than charged as a failed attempt.
        if (signal.aborted) return { kind: "aborted", reason: signal.reason, results };
        return { kind: "failed", results, error: `${at}: ${describeFailure(receipt)}`, permanent: false };
      }
      previous = output;
    }
    return { kind: "succeeded", results, output: previous ?? inlineOutput(Buffer.alloc(0)) };
  } catch (err) {
    discard(deps.blobs, previous);
    return caught(err, signal, results, "exec");
  }
}

// The sink's output once the backend ended it; a backend that returned stdout as a Buffer
// instead (an in-process backend) has it written now.
async function collect(sink: OutputSink, stdout: Buffer): Promise<ItemOutput | undefined> {
  if (!sink.writableEnded && !sink.destroyed) sink.end(stdout);
  try {
    await finished(sink);
  } catch {
    return undefined;
  }
  return sink.output;
}

// Stored stdout nobody will read again; the sweep deletes it anyway if this fails.
function discard(blobs: BlobStore, output: ItemOutput | undefined): void {
  if (output?.blobId) void blobs.delete(output.blobId).catch(() => undefined);
}

async function runLocal(item: QueueItem, deps: RunnerDeps, signal: AbortSignal): Promise<Outcome> {
  const local = item.local;
  const action = local && deps.actions.get(local.name);
  if (!local || !action) {
    // Validated at submit; only a fylr built without the action gets here.
    return { kind: "failed", results: [], error: `local action "${local?.name ?? "?"}" is not available on this fylr`, permanent: false };
  }
  try {
    deps.live.setPhase(item.id, item.lease, "running", { service: local.name });
    deps.onStart();
    const output = await action.run(local.params, local.input, signal);
    if (output.length > deps.maxOutputBytes) {
      const error = `local action ${local.name}: output is ${output.length} bytes, over the ${deps.maxOutputBytes}-byte limit (dispatcher.maxOutputBytes)`;
      return { kind: "failed", results: [], error, permanent: true };
    }
    return { kind: "succeeded", results: [], output: inlineOutput(output) };
  } catch (err) {
    return caught(err, signal, [], `local action ${local.name}`);
  }
}

function caught(err: unknown, signal: AbortSignal, results: readonly CallResult[], what: string): Outcome {
  if (signal.aborted) return { kind: "aborted", reason: signal.reason, results };
  // By code, not by class: see the ExecBackend contract.
  if (err instanceof SlotbrokerError && err.code === Code.ResourceExhausted) return { kind: "no-slot", error: err };
  const message = err instanceof Error ? err.message : String(err);
  // An abort error while our signal is not aborted came from below (e.g. a fetch's own
  // timeout): a failed attempt like any other.
  const prefix = isAbortError(err) ? "aborted: " : "";
  return { kind: "failed", results, error: `${what}: ${prefix}${message}`, permanent: false };
}

// The call's stdin for the backend, or a string saying why it cannot be had (permanent).
async function resolveStdin(call: ExecCallSpec, previous: ItemOutput | undefined, blobs: BlobStore): Promise<Buffer | URL | Readable | string | undefined> {
  switch (call.stdin?.kind) {
    case undefined:
      return undefined;
    case "data":
      return call.stdin.data;
    case "url":
      return new URL(call.stdin.url);
    case "upload": {
      const info = await blobs.info(call.stdin.id);
      if (!info) return `stdin upload ${call.stdin.id} is gone (deleted with its item or after the retention, store.retention)`;
      return blobs.read(info);
    }
    case "previous":
      return previous ? readOutput(blobs, previous) : Buffer.alloc(0);
  }
}

const errorKinds: Record<ErrorKind, string> = {
  [ErrorKind.UNSPECIFIED]: "failed",
  [ErrorKind.TIMEOUT]: "timed out",
  [ErrorKind.KILLED]: "was killed",
  [ErrorKind.SPAWN_FAILED]: "could not be started",
  [ErrorKind.PIPE_FAILED]: "pipe failed",
  [ErrorKind.CANCELLED]: "was cancelled",
  [ErrorKind.CANCEL_REQUESTED]: "was cancelled on request",
};

/** "exited with code 1: <stderr line>", "timed out: …", "killed by SIGKILL". */
export function describeFailure(receipt: Receipt): string {
  const detail = receipt.errorMessage || receipt.stderrLine;
  const head = failureHead(receipt);
  // A detail that already opens with what the head says (an execserver's "killed by
  // SIGKILL", an older one's "exited with code 3; …") is not said twice.
  if (!detail || detail === head) return head;
  if (detail.startsWith(`${head}; `) || detail.startsWith(`${head}: `)) return detail;
  return `${head}: ${detail}`;
}

function failureHead(receipt: Receipt): string {
  if (receipt.signal && (receipt.error === ErrorKind.UNSPECIFIED || receipt.error === ErrorKind.KILLED)) return `killed by ${receipt.signal}`;
  if (receipt.error !== ErrorKind.UNSPECIFIED) return errorKinds[receipt.error] ?? "failed";
  if (receipt.exitCode !== undefined) return `exited with code ${receipt.exitCode}`;
  return "failed without an exit code";
}
