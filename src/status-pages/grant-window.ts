/**
 * Fairness over a recent window. GetStatus counts grants since each connection opened, so
 * an index over those counts stays low for as long as a connection that joined late lives.
 * The page instead compares grant *rates* over the last minute: it keeps a few snapshots
 * of the per-connection counters (taken when the page is drawn, at most one per
 * `sampleEveryMs`), and judges each connection by grants since the oldest snapshot within
 * the window, per second it was connected since then. Pure: the caller passes the clock.
 */
import { jainIndex } from "./format.js";

/** What the window needs of a connection. */
export interface WindowConnection {
  readonly id: string;
  /** Grants since the connection opened. */
  readonly grants: number;
  readonly parked: number;
  readonly offers: number;
  /** Since the connection opened; undefined when unknown. */
  readonly ageMs: number | undefined;
}

/** The fairness of the grants in a recent window. */
export interface WindowFairness {
  /** Jain's index over the grant rates of the connections that asked; undefined without any. */
  readonly index: number | undefined;
  /** How many connections it was taken over. */
  readonly over: number;
  /** The span the rates cover, ms; undefined while no snapshot is old enough (rates since each connection opened). */
  readonly spanMs: number | undefined;
}

/** Tuning of GrantWindow. */
export interface GrantWindowOptions {
  /** The window (default 60 s). */
  readonly windowMs: number;
  /** Snapshots at most this often (default 5 s). */
  readonly sampleEveryMs: number;
  /** A connection younger than this counts as this old, so a brand-new one's first grant is not a huge rate (default 10 s). */
  readonly minSpanMs: number;
}

/** Defaults of GrantWindowOptions. */
export const defaultGrantWindow: GrantWindowOptions = { windowMs: 60_000, sampleEveryMs: 5_000, minSpanMs: 10_000 };

interface Snapshot {
  readonly at: number;
  /** Connection id → [grants, offers] at that moment. */
  readonly counts: ReadonlyMap<string, readonly [number, number]>;
}

/** Per-connection grant snapshots over the last window, and the fairness of the rates. */
export class GrantWindow {
  private readonly snapshots: Snapshot[] = [];

  constructor(readonly options: GrantWindowOptions = defaultGrantWindow) {}

  /** Records a snapshot when one is due, then judges the rates over the window ending at `now`. */
  fairness(now: number, connections: readonly WindowConnection[]): WindowFairness {
    const { windowMs, sampleEveryMs, minSpanMs } = this.options;
    while (this.snapshots.length > 0 && this.snapshots[0]!.at < now - windowMs) this.snapshots.shift();
    const last = this.snapshots[this.snapshots.length - 1];
    // The oldest snapshot in the window is the baseline, once it is old enough to mean something.
    const oldest = this.snapshots[0];
    const baseline = oldest && now - oldest.at >= minSpanMs ? oldest : undefined;
    if (!last || now - last.at >= sampleEveryMs) this.snapshots.push({ at: now, counts: new Map(connections.map((c) => [c.id, [c.grants, c.offers]])) });
    const rates: number[] = [];
    for (const c of connections) {
      const [grantsBefore, offersBefore] = baseline?.counts.get(c.id) ?? [0, 0];
      const grants = c.grants - grantsBefore;
      // Asked for nothing in the window (nothing parked, offered or granted): not starved.
      if (c.parked + (c.offers - offersBefore) + grants === 0) continue;
      const alive = c.ageMs ?? windowMs;
      const span = Math.max(minSpanMs, baseline ? Math.min(now - baseline.at, alive) : alive);
      rates.push(grants / span);
    }
    return { index: jainIndex(rates), over: rates.length, spanMs: baseline ? now - baseline.at : undefined };
  }
}
