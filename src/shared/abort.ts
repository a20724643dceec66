/** Why a long-lived operation was stopped; carried as the AbortSignal's reason. */
export class AbortReason extends Error {
  override name = "AbortError";
  constructor(readonly kind: "shutdown" | "deadline" | "cancelled" | "disconnected", message: string) {
    super(message);
  }
}

/** An AbortController that also aborts when any of `signals` aborts, with the same reason. */
export function linkedAbortController(...signals: (AbortSignal | undefined)[]): AbortController {
  const controller = new AbortController();
  for (const signal of signals) {
    if (!signal) continue;
    if (signal.aborted) {
      controller.abort(signal.reason);
      break;
    }
    signal.addEventListener("abort", () => controller.abort(signal.reason), { once: true, signal: controller.signal });
  }
  return controller;
}

/** Resolves after `ms`, or rejects with the signal's reason when it aborts first. */
export function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) return reject(signal.reason as Error);
    const timer = setTimeout(() => {
      signal?.removeEventListener("abort", onAbort);
      resolve();
    }, ms);
    const onAbort = (): void => {
      clearTimeout(timer);
      reject(signal!.reason as Error);
    };
    signal?.addEventListener("abort", onAbort, { once: true });
  });
}
