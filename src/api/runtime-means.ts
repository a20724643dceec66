/**
 * Rolling mean runtime per service, from the receipts of the exec calls this fylr ran. The
 * ETA hint of a queue position multiplies it by the line ahead; a hint, never a promise.
 */
import type { ExecBackend } from "../dispatcher/index.js";
import { durationMs } from "@bufbuild/protobuf/wkt";

/** The last `window` runtimes of each service, averaged. Pure: no timers, no I/O. */
export class RuntimeMeans {
  private readonly samples = new Map<string, { values: number[]; next: number; sum: number }>();

  constructor(private readonly window = 50) {}

  /** Records one finished call's runtime. */
  record(service: string, ms: number): void {
    if (!Number.isFinite(ms) || ms < 0) return;
    let entry = this.samples.get(service);
    if (!entry) this.samples.set(service, (entry = { values: [], next: 0, sum: 0 }));
    if (entry.values.length < this.window) {
      entry.values.push(ms);
    } else {
      entry.sum -= entry.values[entry.next]!;
      entry.values[entry.next] = ms;
      entry.next = (entry.next + 1) % this.window;
    }
    entry.sum += ms;
  }

  /** The mean runtime of `service` in ms, or undefined without history. */
  meanMs(service: string): number | undefined {
    const entry = this.samples.get(service);
    return entry && entry.values.length > 0 ? entry.sum / entry.values.length : undefined;
  }
}

/** Wraps an ExecBackend so that every call that ran records its runtime in `means`. */
export function measuredBackend(backend: ExecBackend, means: RuntimeMeans): ExecBackend {
  return {
    async run(request, options) {
      const result = await backend.run(request, options);
      const ms = result.receipt.duration && durationMs(result.receipt.duration);
      if (ms !== undefined) means.record(request.service, ms);
      return result;
    },
  };
}
