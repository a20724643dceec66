import type { Hello } from "../../../gen/slotbroker/v1/broker_pb.js";
import type { ParkedWantInfo } from "./connection-options.js";

/**
 * The wants parked on one connection (or waiting to be re-registered on its next stream),
 * oldest first. Pure bookkeeping: the connection sends the WANT and UNWANT frames.
 */
export class ParkedWants {
  // Map iteration follows insertion order, so the first entry is the oldest.
  private readonly wants = new Map<string, ParkedWantInfo>();

  /** Wants parked. */
  get size(): number {
    return this.wants.size;
  }

  /** True when `jobId` is parked. */
  has(jobId: string): boolean {
    return this.wants.has(jobId);
  }

  /** Parks `jobId` (a want parked again keeps its place and takes the new details). */
  add(jobId: string, want: ParkedWantInfo): void {
    this.wants.set(jobId, want);
  }

  /** Forgets `jobId`; true when it was parked. */
  delete(jobId: string): boolean {
    return this.wants.delete(jobId);
  }

  /** Removes `jobId` and returns how it was parked (undefined when it was not). */
  take(jobId: string): ParkedWantInfo | undefined {
    const want = this.wants.get(jobId);
    if (want) this.wants.delete(jobId);
    return want;
  }

  /** When the oldest want was parked; undefined when none is. */
  oldestParkedAt(): number | undefined {
    for (const want of this.wants.values()) return want.parkedAt;
    return undefined;
  }

  /** Every parked want, oldest first. */
  entries(): IterableIterator<[string, ParkedWantInfo]> {
    return this.wants.entries();
  }

  /** Forgets every want; returns their job ids, oldest first. */
  clear(): string[] {
    const dropped = [...this.wants.keys()];
    this.wants.clear();
    return dropped;
  }

  /** Forgets the wants `hello` does not serve (service not listed, or draining); returns their ids. */
  dropUnserved(hello: Pick<Hello, "services" | "draining">): string[] {
    const dropped: string[] = [];
    for (const [jobId, want] of this.wants) {
      if (want.service in hello.services && !hello.draining) continue;
      this.wants.delete(jobId);
      dropped.push(jobId);
    }
    return dropped;
  }
}
