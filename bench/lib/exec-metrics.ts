// What the execservers count, read from their /metrics and summed: broker frames, legacy
// requests and the slot idle gap histogram, with the arithmetic to compare two scrapes.

/** One scrape of the counters that matter, summed over the execservers scraped. */
export interface Counts {
  /** Broker frames received, Pings excluded. */
  frames: number;
  pings: number;
  legacy: number;
  /** slot idle gap histogram: cumulative count per `le`, and sum/count. */
  gapBuckets: Map<number, number>;
  gapSum: number;
  gapCount: number;
}

/** Scrapes /metrics of every admin address ("host:port") and sums what matters. */
export async function scrape(admins: readonly string[]): Promise<Counts> {
  const counts: Counts = { frames: 0, pings: 0, legacy: 0, gapBuckets: new Map(), gapSum: 0, gapCount: 0 };
  for (const admin of admins) {
    const text = await (await fetch(`http://${admin}/metrics`)).text();
    for (const line of text.split("\n")) {
      const value = Number(line.slice(line.lastIndexOf(" ") + 1));
      if (line.startsWith("slotbroker_frames_received_total{")) {
        if (line.includes('kind="ping"')) counts.pings += value;
        else counts.frames += value;
      } else if (line.startsWith("slotbroker_legacy_requests_total{")) counts.legacy += value;
      else if (line.startsWith("slotbroker_slot_idle_gap_seconds_bucket{")) {
        const le = /le="([^"]+)"/.exec(line)![1]!;
        const key = le === "+Inf" ? Infinity : Number(le);
        counts.gapBuckets.set(key, (counts.gapBuckets.get(key) ?? 0) + value);
      } else if (line.startsWith("slotbroker_slot_idle_gap_seconds_sum{")) counts.gapSum += value;
      else if (line.startsWith("slotbroker_slot_idle_gap_seconds_count{")) counts.gapCount += value;
    }
  }
  return counts;
}

/** What happened between two scrapes. */
export function delta(after: Counts, before: Counts): Counts {
  const gapBuckets = new Map<number, number>();
  for (const [le, n] of after.gapBuckets) gapBuckets.set(le, n - (before.gapBuckets.get(le) ?? 0));
  return {
    frames: after.frames - before.frames,
    pings: after.pings - before.pings,
    legacy: after.legacy - before.legacy,
    gapBuckets,
    gapSum: after.gapSum - before.gapSum,
    gapCount: after.gapCount - before.gapCount,
  };
}

/** Two deltas added up (rounds of the same transport). */
export function add(a: Counts, b: Counts): Counts {
  const gapBuckets = new Map(a.gapBuckets);
  for (const [le, n] of b.gapBuckets) gapBuckets.set(le, (gapBuckets.get(le) ?? 0) + n);
  return { frames: a.frames + b.frames, pings: a.pings + b.pings, legacy: a.legacy + b.legacy, gapBuckets, gapSum: a.gapSum + b.gapSum, gapCount: a.gapCount + b.gapCount };
}

/** Nothing counted yet. */
export const zero = (): Counts => ({ frames: 0, pings: 0, legacy: 0, gapBuckets: new Map(), gapSum: 0, gapCount: 0 });

/** The q-quantile (0..1) of a cumulative histogram, interpolated linearly within its bucket (ms). */
export function quantileMs(buckets: Map<number, number>, q: number): number {
  const sorted = [...buckets.entries()].sort((x, y) => x[0] - y[0]);
  const total = sorted.at(-1)?.[1] ?? 0;
  if (total === 0) return 0;
  const rank = q * total;
  let lower = 0;
  let below = 0;
  for (const [le, cumulative] of sorted) {
    if (cumulative >= rank) {
      if (le === Infinity) return lower * 1000;
      const inBucket = cumulative - below;
      const fraction = inBucket === 0 ? 0 : (rank - below) / inBucket;
      return (lower + (le - lower) * fraction) * 1000;
    }
    lower = le;
    below = cumulative;
  }
  return lower * 1000;
}

