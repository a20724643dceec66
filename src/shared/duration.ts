const units: Record<string, number> = { ms: 1, s: 1000, m: 60_000, h: 3_600_000, d: 86_400_000 };
const pattern = /^(\d+(?:\.\d+)?)(ms|s|m|h|d)$/;

/**
 * Parses a duration with a unit ("250ms", "5s", "1.5m", "2h") into milliseconds.
 * Returns undefined for anything else; bare numbers are refused on purpose, so a config
 * never has to guess whether 5 meant seconds or milliseconds.
 */
export function parseDuration(text: string): number | undefined {
  const m = pattern.exec(text.trim());
  if (!m) return undefined;
  return Math.round(Number(m[1]) * (units[m[2]!] ?? 1));
}

/** Formats milliseconds the way parseDuration reads them back. */
export function formatDuration(ms: number): string {
  if (ms % 3_600_000 === 0 && ms > 0) return `${ms / 3_600_000}h`;
  if (ms % 60_000 === 0 && ms > 0) return `${ms / 60_000}m`;
  if (ms % 1000 === 0) return `${ms / 1000}s`;
  return `${ms}ms`;
}
