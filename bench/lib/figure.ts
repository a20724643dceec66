/** One benchmark figure, printed as a JSON line (see bench/README.md). */
export interface Figure {
  bench: string;
  metric: string;
  value: number;
  baseline: string;
  baseline_value: number;
  ratio: number;
  params: Record<string, unknown>;
}

/** Prints a figure; `ratio` is value / baseline_value. Say in params which way is better. */
export function emit(figure: Omit<Figure, "ratio">): Figure {
  const ratio = figure.baseline_value === 0 ? 0 : figure.value / figure.baseline_value;
  const full: Figure = { ...figure, value: round(figure.value), baseline_value: round(figure.baseline_value), ratio: round(ratio, 3) };
  process.stdout.write(`${JSON.stringify(full)}\n`);
  return full;
}

function round(n: number, digits = 2): number {
  const f = 10 ** digits;
  return Math.round(n * f) / f;
}

/** Percentile (0..100) of a numeric sample, nearest-rank. */
export function percentile(sorted: readonly number[], p: number): number {
  if (sorted.length === 0) return 0;
  const rank = Math.min(sorted.length - 1, Math.max(0, Math.ceil((p / 100) * sorted.length) - 1));
  return sorted[rank]!;
}

/** High-resolution time in microseconds. */
export function nowUs(): number {
  return Number(process.hrtime.bigint()) / 1000;
}
