/**
 * Admission arithmetic, pure: how many items this fylr may claim right now.
 *
 * Exec-bound work is bounded by a fair share of the exec capacity the fylr can see, so
 * several fylrs on one database and one exec fleet split the work without talking to each
 * other: each instance offers `ceil(capacity / clients)` slots per connected fylr, plus a
 * small pipelining headroom so a parked want is ready the moment a slot frees.
 */
import type { ExecInstance } from "./capacity.js";

/** This fylr's claim share of one execserver instance. */
export interface InstanceShare {
  readonly instanceId: string;
  readonly address: string;
  readonly capacity: number;
  readonly clients: number;
  /** ceil(capacity / clients) + headroom; 0 when the instance has no capacity. */
  readonly share: number;
}

/** Exec-bound admission for one loop pass. */
export interface ExecAdmission {
  /** Σ shares: the exec items this fylr may hold. */
  readonly admission: number;
  /** Exec items held now (claimed or running). */
  readonly held: number;
  /** How many more may be claimed now: max(0, admission − held). */
  readonly free: number;
  readonly shares: readonly InstanceShare[];
}

/**
 * One instance's share. An instance with no capacity (none configured, or draining) gets
 * no headroom either: headroom pipelines work into slots that exist, it is not capacity.
 * `clients` below 1 is read as 1: this fylr is connected, so it is at least one client.
 */
export function instanceShare(instance: ExecInstance, headroom: number): number {
  if (instance.capacity <= 0) return 0;
  const clients = Math.max(1, Math.floor(instance.clients));
  return Math.ceil(instance.capacity / clients) + headroom;
}

/**
 * Σ over connected instances of `ceil(capacity / clients) + headroom`, minus exec items
 * already held. No instance → 0: nothing exec-bound is claimed without an execserver.
 * An instance listed twice (same instanceId) counts once: two connections that reached
 * the same pod must not double this fylr's share.
 */
export function execAdmission(instances: readonly ExecInstance[], held: number, headroom: number): ExecAdmission {
  const seen = new Set<string>();
  const shares: InstanceShare[] = [];
  for (const instance of instances) {
    if (seen.has(instance.instanceId)) continue;
    seen.add(instance.instanceId);
    shares.push({
      instanceId: instance.instanceId,
      address: instance.address,
      capacity: instance.capacity,
      clients: instance.clients,
      share: instanceShare(instance, headroom),
    });
  }
  const admission = shares.reduce((sum, s) => sum + s.share, 0);
  return { admission, held, free: Math.max(0, admission - held), shares };
}

/** Local slots reserved for high-priority items: a quarter, at least one when there are two or more. */
export function reservedForHigh(capacity: number): number {
  if (capacity < 2) return 0;
  return Math.max(1, Math.floor(capacity / 4));
}
