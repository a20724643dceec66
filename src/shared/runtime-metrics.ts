import { collectDefaultMetrics, Registry } from "prom-client";

// The Node.js runtime families (process_cpu_seconds_total, process_resident_memory_bytes,
// nodejs_eventloop_lag_seconds, nodejs_gc_duration_seconds, …) under prom-client's standard
// names, which ready-made dashboards and alerts look for. They describe the process, not
// one server in it, so they live in one registry per process: every collectDefaultMetrics
// call starts an event-loop monitor and a GC observer that are never stopped, and a
// process may run several servers (`slotbroker up`, tests).
let runtime: Registry | undefined;

/** The process's runtime metrics registry; its collectors start on the first call. */
export function runtimeMetrics(): Registry {
  if (!runtime) {
    runtime = new Registry();
    collectDefaultMetrics({ register: runtime });
    // Gauges with a counter's suffix, which Prometheus's linter (promtool check metrics)
    // flags; each is the sum of its family without the suffix, kept (by type).
    for (const name of ["nodejs_active_handles_total", "nodejs_active_requests_total", "nodejs_active_resources_total"]) runtime.removeSingleMetric(name);
  }
  return runtime;
}

/** `registry` in the Prometheus text format, followed by the process's runtime families. */
export async function renderWithRuntime(registry: Registry): Promise<string> {
  const [own, process] = await Promise.all([registry.metrics(), runtimeMetrics().metrics()]);
  return own.endsWith("\n") || own === "" ? own + process : `${own}\n${process}`;
}
