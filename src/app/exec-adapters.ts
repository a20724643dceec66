/**
 * Where the dispatcher meets the broker client. The two never import each other; these
 * adapters give the dispatcher its ExecBackend (an ExecClient's run) and its
 * CapacitySource (the broker client's instances).
 */
import { Readable } from "node:stream";
import type { CapacitySource, ExecBackend, ExecRequest, ExecResult, ExecRunOptions } from "../dispatcher/index.js";
import type { BrokerClient, ExecClient } from "../fylr/index.js";
import { Code, SlotbrokerError } from "../shared/errors.js";

/** The dispatcher's CapacitySource: the instances the broker client reaches now. */
export function brokerCapacity(broker: BrokerClient): CapacitySource {
  return {
    instances: () => broker.instances(),
    subscribe: (listener) => broker.subscribe(listener),
  };
}

/**
 * The dispatcher's ExecBackend on top of an ExecClient. A NoSlotError carries code
 * RESOURCE_EXHAUSTED, which the dispatcher reads as "no slot in time".
 */
export function execBackend(client: ExecClient, options: { readonly followRedirects?: boolean } = {}): ExecBackend {
  const redirect: "error" | "follow" = options.followRedirects === false ? "error" : "follow";
  return {
    async run(request: ExecRequest, options: ExecRunOptions): Promise<ExecResult> {
      const result = await client.run({
        service: request.service,
        args: request.args,
        env: request.env,
        timeoutMs: request.timeoutMs,
        priority: options.priority,
        fairnessKey: options.fairnessKey,
        fairnessWeight: options.fairnessWeight,
        signal: options.signal,
        stdin: request.stdin instanceof URL ? fetchLazily(request.stdin, options.signal, redirect) : request.stdin,
        stdout: options.stdout,
        maxStdoutBytes: options.maxStdoutBytes,
        onPosition: options.onPosition && ((position) => options.onPosition!(position)),
        onStart: options.onStart && ((job) => options.onStart!(job.instanceId, job.waitgroup)),
        traceparent: request.traceparent,
      });
      return { receipt: result.receipt, stdout: result.stdout ?? Buffer.alloc(0) };
    },
  };
}

// The fetch starts only when the execserver reads the in-pipe: Readable.from pulls the
// generator on the first read, so no connection is held open while the want is parked.
function fetchLazily(url: URL, signal: AbortSignal, redirect: "error" | "follow"): Readable {
  return Readable.from(
    (async function* () {
      const response = await fetch(url, { signal, redirect });
      if (!response.ok || !response.body) {
        throw new SlotbrokerError(Code.Unavailable, `stdin ${url.href}: HTTP ${response.status}`);
      }
      for await (const chunk of response.body as AsyncIterable<Uint8Array>) yield chunk;
    })(),
    { objectMode: false },
  );
}
