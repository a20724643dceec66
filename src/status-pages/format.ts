/**
 * Numbers, durations and small statistics for the status pages. Pure; no locale surprises
 * (the pages render the same in any server locale).
 */

/** An integer with thin-space-free thousands separators: 12,345. */
export function formatCount(n: number): string {
  const sign = n < 0 ? "-" : "";
  const digits = String(Math.round(Math.abs(n)));
  return sign + digits.replace(/\B(?=(\d{3})+(?!\d))/g, ",");
}

/** A duration for people: 850 ms, 4.2 s, 3 m 12 s, 5 h 02 m, 3 d 4 h. */
export function formatDuration(ms: number): string {
  if (!Number.isFinite(ms) || ms < 0) return "–";
  if (ms < 1000) return `${Math.round(ms)} ms`;
  const s = ms / 1000;
  if (s < 60) return `${s < 10 ? s.toFixed(1) : Math.floor(s)} s`;
  const totalS = Math.floor(s);
  const m = Math.floor(totalS / 60);
  if (m < 60) return `${m} m ${totalS % 60} s`;
  const h = Math.floor(m / 60);
  if (h < 24) return `${h} h ${String(m % 60).padStart(2, "0")} m`;
  return `${Math.floor(h / 24)} d ${h % 24} h`;
}

/** A share as a percentage with one decimal below 10 %: 3.4 %, 27 %. */
export function formatPercent(part: number, whole: number): string {
  if (whole <= 0) return "0 %";
  const p = (100 * part) / whole;
  return `${p > 0 && p < 10 ? p.toFixed(1) : Math.round(p)} %`;
}

/**
 * Jain's fairness index (Σx)² / (n·Σx²): 1 when every value is equal, 1/n when one value
 * takes everything. Undefined for no values or all zeros (nothing to be fair about).
 */
export function jainIndex(values: readonly number[]): number | undefined {
  let sum = 0;
  let squares = 0;
  for (const v of values) {
    sum += v;
    squares += v * v;
  }
  if (values.length === 0 || squares === 0) return undefined;
  return (sum * sum) / (values.length * squares);
}

/** The first `n` items and a summary of the rest, for lists that must stay readable. */
export interface TopN<T> {
  readonly shown: readonly T[];
  /** How many were left out. */
  readonly more: number;
  readonly rest: readonly T[];
}

/** Sorts a copy by `compare` and keeps the first `n`. */
export function topN<T>(items: readonly T[], n: number, compare: (a: T, b: T) => number): TopN<T> {
  const sorted = [...items].sort(compare);
  return { shown: sorted.slice(0, n), more: Math.max(0, sorted.length - n), rest: sorted.slice(n) };
}

/** A fraction in [0, 1] of `value` over `max` (0 when max is 0). */
export function fraction(value: number, max: number): number {
  if (max <= 0 || value <= 0) return 0;
  return Math.min(1, value / max);
}
