/**
 * The OpenTelemetry SDK, started for one process. Imported only dynamically (by
 * ./start.ts) when the environment asks for traces: a process without them never loads
 * these packages, which are optional dependencies.
 */
import { NodeTracerProvider, BatchSpanProcessor, ConsoleSpanExporter, SimpleSpanProcessor, type SpanProcessor } from "@opentelemetry/sdk-trace-node";
import { OTLPTraceExporter } from "@opentelemetry/exporter-trace-otlp-proto";
import { defaultResource, detectResources, envDetector, resourceFromAttributes } from "@opentelemetry/resources";
import type { TracingSettings } from "./sdk-config.js";
import { SyncContextManager } from "./sync-context.js";

/**
 * Registers a tracer provider exporting as `settings` say, named `serviceName` unless
 * OTEL_SERVICE_NAME or OTEL_RESOURCE_ATTRIBUTES say otherwise. Sampling, batching and the
 * OTLP endpoint, headers and timeout follow their standard variables; the context manager
 * is the synchronous one (./sync-context.ts). Returns the shutdown, which exports what is
 * still buffered.
 */
export function startSdk(settings: TracingSettings, serviceName: string, attributes: Record<string, string>): () => Promise<void> {
  const resource = defaultResource()
    .merge(resourceFromAttributes({ "service.name": serviceName, ...attributes }))
    .merge(detectResources({ detectors: [envDetector] }));
  const spanProcessors: SpanProcessor[] = settings.exporters.map((name) =>
    name === "otlp" ? new BatchSpanProcessor(new OTLPTraceExporter()) : new SimpleSpanProcessor(new ConsoleSpanExporter()),
  );
  const provider = new NodeTracerProvider({ resource, spanProcessors });
  provider.register({ contextManager: new SyncContextManager() });
  return () => provider.shutdown();
}
