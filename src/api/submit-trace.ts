/**
 * The Submit span: the first span of an item's trace, a child of the caller's span when the
 * request carries a W3C `traceparent` header (HTTP, or gRPC metadata). Its traceparent is
 * stored with the item, so the claim continues the trace on whichever fylr.
 */
import type { Dispatcher, QueueItem, SubmitInput } from "../dispatcher/index.js";
import { SpanKind, contextFrom, endFailed, traceparentOf, tracer } from "../shared/tracing/index.js";

/** dispatcher.submit inside a Submit span continuing `callerTraceparent` (a malformed one starts a new trace). */
export async function tracedSubmit(dispatcher: Dispatcher, input: SubmitInput, callerTraceparent: string | null): Promise<{ item: QueueItem; created: boolean }> {
  const calls = input.calls ?? [];
  const span = tracer.startSpan(
    "slotbroker.submit",
    {
      kind: SpanKind.SERVER,
      attributes: {
        "slotbroker.item.kind": input.local ? "local" : "exec",
        "slotbroker.service": input.local ? input.local.name : calls.map((c) => c.service).join(","),
        "slotbroker.calls": calls.length,
        "slotbroker.priority": input.priority ?? 0,
      },
    },
    contextFrom(callerTraceparent ?? undefined),
  );
  try {
    const result = await dispatcher.submit({ ...input, traceparent: traceparentOf(span) });
    span.setAttributes({ "slotbroker.item.id": result.item.id, "slotbroker.item.created": result.created, "slotbroker.item.state": result.item.state });
    span.end();
    return result;
  } catch (err) {
    endFailed(span, err instanceof Error ? err.message : String(err));
    throw err;
  }
}
