/**
 * Traces through the OpenTelemetry API only; the SDK behind it is started by the CLI when
 * the standard OTEL_* variables ask for it (./sdk-start.ts). Until then every span here is
 * a no-op, and the hot paths check `tracing.on` first so they build no context, span or
 * string per item.
 *
 * One item is one trace. Its context crosses processes as a W3C `traceparent` string: the
 * caller's request header, the `queue_items.traceparent` column, the JOB frame's
 * `traceparent`, the job's TRACEPARENT variable.
 */
import { ROOT_CONTEXT, SpanKind, SpanStatusCode, TraceFlags, isSpanContextValid, trace, type Attributes, type Context, type Span, type SpanContext } from "@opentelemetry/api";

/** Whether a tracer provider was registered (set once by the SDK start). */
export const tracing = { on: false };

/** Every span of slotbroker comes from this tracer. */
export const tracer = trace.getTracer("slotbroker");

export { SpanKind, SpanStatusCode, type Attributes, type Context, type Span };

// version-traceid-parentid-flags; version ff is invalid; a future version may append fields.
const traceparentPattern = /^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?$/;

/** The span context a W3C traceparent names, or undefined when it is malformed (never throws). */
export function parseTraceparent(value: string | undefined): SpanContext | undefined {
  if (!value || value.length > 512) return undefined;
  const m = traceparentPattern.exec(value.trim());
  if (!m || m[1] === "ff" || (m[1] === "00" && m[5] !== undefined)) return undefined;
  const context: SpanContext = { traceId: m[2]!, spanId: m[3]!, traceFlags: parseInt(m[4]!, 16) & TraceFlags.SAMPLED, isRemote: true };
  return isSpanContextValid(context) ? context : undefined;
}

/** True when `value` is a well-formed traceparent of a valid span context. */
export function isTraceparent(value: string): boolean {
  return parseTraceparent(value) !== undefined;
}

/** The W3C traceparent of a span context. */
export function formatTraceparent(context: SpanContext): string {
  return `00-${context.traceId}-${context.spanId}-0${context.traceFlags & TraceFlags.SAMPLED}`;
}

/** The traceparent of `span`, or undefined for a span that is not recording a valid context. */
export function traceparentOf(span: Span): string | undefined {
  const context = span.spanContext();
  return isSpanContextValid(context) ? formatTraceparent(context) : undefined;
}

/** A context whose parent is the span `traceparent` names (the root context when it names none). */
export function contextFrom(traceparent: string | undefined): Context {
  const parent = parseTraceparent(traceparent);
  return parent ? trace.setSpanContext(ROOT_CONTEXT, parent) : ROOT_CONTEXT;
}

/** A context whose active span is `span`. */
export function withSpan(span: Span, parent: Context = ROOT_CONTEXT): Context {
  return trace.setSpan(parent, span);
}

/** Ends `span` as failed with `message`. */
export function endFailed(span: Span, message: string): void {
  span.setStatus({ code: SpanStatusCode.ERROR, message });
  span.end();
}

/** trace_id and span_id of the active span, for log lines; undefined without one. */
export function activeTraceIds(): { trace_id: string; span_id: string } | undefined {
  const context = trace.getActiveSpan()?.spanContext();
  return context && isSpanContextValid(context) ? { trace_id: context.traceId, span_id: context.spanId } : undefined;
}
