/**
 * Runs one claimed item and says how it went, without touching the database: the
 * dispatcher turns the Outcome into the fenced write. Exec calls run in order, each one's
 * stdin inline, by URL, or the previous call's stdout; the last stdout is the output.
 */
import type { Receipt } from "../../gen/slotbroker/v1/broker_pb.js";
import { ErrorKind } from "../../gen/slotbroker/v1/broker_pb.js";
import { Code, SlotbrokerError, isAbortError } from "../shared/errors.js";
import { receiptSucceeded } from "../shared/receipt.js";
import type { ExecBackend } from "./exec-backend.js";
import type { LiveItems } from "./live.js";
import type { LocalActionRegistry } from "./local-actions.js";
import type { CallResult, ExecCallSpec, QueueItem } from "./types.js";

/** How an attempt ended. */
export type Outcome =
  | { readonly kind: "succeeded"; readonly results: readonly CallResult[]; readonly output: Buffer }
  /** `permanent`: retrying cannot help (output over the limit, action gone), fail now. */
  | { readonly kind: "failed"; readonly results: readonly CallResult[]; readonly error: string; readonly permanent: boolean }
  /** The backend got no slot in time (an error of code RESOURCE_EXHAUSTED). */
  | { readonly kind: "no-slot"; readonly error: SlotbrokerError }
  /** The signal aborted; `reason` is the signal's reason. */
  | { readonly kind: "aborted"; readonly reason: unknown };

/** What the runner needs from the dispatcher. */
export interface RunnerDeps {
  readonly backend: ExecBackend;
  readonly actions: LocalActionRegistry;
  readonly live: LiveItems;
  readonly maxOutputBytes: number;
  /** Called once when the item starts running (first slot granted, or the local action begins). */
  readonly onStart: () => void;
}

/** Runs an item of either kind. Never rejects. */
export function runItem(item: QueueItem, deps: RunnerDeps, signal: AbortSignal): Promise<Outcome> {
  return item.kind === "exec" ? runExec(item, deps, signal) : runLocal(item, deps, signal);
}

async function runExec(item: QueueItem, deps: RunnerDeps, signal: AbortSignal): Promise<Outcome> {
  const results: CallResult[] = [];
  let previous: Buffer | undefined;
  try {
    for (const [i, call] of item.calls.entries()) {
      signal.throwIfAborted();
      deps.live.setPhase(item.id, item.lease, "waiting", { callIndex: i, service: call.service });
      const { receipt, stdout } = await deps.backend.run(
        { service: call.service, args: call.args, env: call.env, timeoutMs: call.timeoutMs, stdin: resolveStdin(call, previous) },
        {
          priority: item.priority,
          signal,
          maxStdoutBytes: deps.maxOutputBytes,
          onPosition: (position) => deps.live.setPosition(item.id, item.lease, position),
          onStart: (instanceId) => {
            deps.live.setPhase(item.id, item.lease, "running", { instanceId });
            deps.onStart();
          },
        },
      );
      results.push({ service: call.service, receipt });
      // A job that finished despite an abort keeps its result; one the abort cut short is
      // given back rather than charged as a failed attempt.
      if (!receiptSucceeded(receipt) && signal.aborted) return { kind: "aborted", reason: signal.reason };
      if (!receiptSucceeded(receipt)) {
        return { kind: "failed", results, error: `calls[${i}] (${call.service}): ${describeFailure(receipt)}`, permanent: false };
      }
      const size = Math.max(stdout.length, Number(receipt.stdoutBytes));
      if (size > deps.maxOutputBytes) {
        const error = `calls[${i}] (${call.service}): stdout is ${size} bytes, over the ${deps.maxOutputBytes}-byte limit (dispatcher.maxOutputBytes)`;
        return { kind: "failed", results, error, permanent: true };
      }
      previous = stdout;
    }
    return { kind: "succeeded", results, output: previous ?? Buffer.alloc(0) };
  } catch (err) {
    return caught(err, signal, results, "exec");
  }
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
    return { kind: "succeeded", results: [], output };
  } catch (err) {
    return caught(err, signal, [], `local action ${local.name}`);
  }
}

function caught(err: unknown, signal: AbortSignal, results: readonly CallResult[], what: string): Outcome {
  if (signal.aborted) return { kind: "aborted", reason: signal.reason };
  // By code, not by class: see the ExecBackend contract.
  if (err instanceof SlotbrokerError && err.code === Code.ResourceExhausted) return { kind: "no-slot", error: err };
  const message = err instanceof Error ? err.message : String(err);
  // An abort error while our signal is not aborted came from below (e.g. a fetch's own
  // timeout): a failed attempt like any other.
  const prefix = isAbortError(err) ? "aborted: " : "";
  return { kind: "failed", results, error: `${what}: ${prefix}${message}`, permanent: false };
}

function resolveStdin(call: ExecCallSpec, previous: Buffer | undefined): Buffer | URL | undefined {
  switch (call.stdin?.kind) {
    case undefined:
      return undefined;
    case "data":
      return call.stdin.data;
    case "url":
      return new URL(call.stdin.url);
    case "previous":
      return previous ?? Buffer.alloc(0);
  }
}

const errorKinds: Record<ErrorKind, string> = {
  [ErrorKind.UNSPECIFIED]: "failed",
  [ErrorKind.TIMEOUT]: "timed out",
  [ErrorKind.KILLED]: "was killed",
  [ErrorKind.SPAWN_FAILED]: "could not be started",
  [ErrorKind.PIPE_FAILED]: "pipe failed",
  [ErrorKind.CANCELLED]: "was cancelled",
};

/** "exited with code 1: <stderr line>", "timed out: …", "killed by SIGKILL". */
export function describeFailure(receipt: Receipt): string {
  const detail = receipt.errorMessage || receipt.stderrLine;
  const suffix = detail ? `: ${detail}` : "";
  if (receipt.error !== ErrorKind.UNSPECIFIED) return `${errorKinds[receipt.error] ?? "failed"}${suffix}`;
  if (receipt.signal) return `killed by ${receipt.signal}${suffix}`;
  if (receipt.exitCode !== undefined) return `exited with code ${receipt.exitCode}${suffix}`;
  return `failed without an exit code${suffix}`;
}
