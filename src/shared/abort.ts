import { setTimeout as delay } from "node:timers/promises";

/**
 * Why a long-lived operation was stopped; carried as the AbortSignal's reason.
 * "cancel-requested": somebody asked for it (a Cancel frame, QueueService.Cancel), as
 * opposed to something breaking ("disconnected") or the process stopping ("shutdown").
 */
export class AbortReason extends Error {
  override name = "AbortError";
  constructor(readonly kind: "shutdown" | "deadline" | "cancelled" | "disconnected" | "cancel-requested", message: string) {
    super(message);
  }
}

/**
 * The reason to abort a controller with once its work is over, only to release whatever
 * listens on its signal. One shared object: `abort()` without a reason builds a fresh
 * DOMException (stack included) per call, a measurable cost when it happens per job.
 */
export const workOver: AbortReason = new AbortReason("cancelled", "the work is over");

/**
 * An AbortController that also aborts when any of `signals` aborts, with the same reason.
 * Abort it when done: that removes its listeners from the parents.
 *
 * Not AbortSignal.any: on Node 20 a signal made by AbortSignal.any that has a listener stays
 * referenced by every source for as long as the source lives, even after it aborted — one
 * per Watch call on the fylr's shutdown signal measured 237 MB per 200 000 calls. Here the
 * link to each parent is dropped as soon as this controller aborts.
 */
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

/**
 * Resolves after `ms`, or rejects with the signal's reason when it aborts first
 * (timers/promises rejects with a generic AbortError that carries the reason as its cause).
 */
export async function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  try {
    await delay(ms, undefined, { signal });
  } catch (err) {
    if (signal?.aborted) throw signal.reason;
    throw err;
  }
}
