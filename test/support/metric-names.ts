/**
 * Prometheus naming rules (prometheus.io/docs/practices/naming, and what `promtool check
 * metrics` lints), checked against the families of a real /metrics exposition.
 */

/** One metric family as the text format declares it (# HELP and # TYPE lines). */
export interface MetricFamily {
  readonly name: string;
  readonly type: string;
  readonly help: string;
  /** Label names seen on its samples. */
  readonly labels: readonly string[];
}

/**
 * The Node.js runtime families (`process_*`, `nodejs_*`): they keep prom-client's standard
 * names, which dashboards look for, so the slotbroker rules below do not apply to them and
 * the operator guide documents them as groups.
 */
export const runtimeFamilyName = /^(process|nodejs)_/;

/** The families slotbroker names itself: all but the runtime ones. */
export function ownFamilies(families: readonly MetricFamily[]): MetricFamily[] {
  return families.filter((f) => !runtimeFamilyName.test(f.name));
}

/** Reads the families (and the label names of their samples) from a text exposition. */
export function metricFamilies(text: string): MetricFamily[] {
  const families = new Map<string, { name: string; type: string; help: string; labels: Set<string> }>();
  const family = (name: string) => {
    let f = families.get(name);
    if (!f) families.set(name, (f = { name, type: "", help: "", labels: new Set() }));
    return f;
  };
  for (const line of text.split("\n")) {
    const meta = /^# (HELP|TYPE) (\S+) ?(.*)$/.exec(line);
    if (meta) {
      if (meta[1] === "HELP") family(meta[2]!).help = meta[3]!;
      else family(meta[2]!).type = meta[3]!;
      continue;
    }
    const sample = /^([^\s{]+)(?:\{(.*)\})? /.exec(line);
    if (!sample) continue;
    const name = sample[1]!;
    const base = [...families.keys()].find((n) => name === n || (name.startsWith(n) && /^_(bucket|sum|count)$/.test(name.slice(n.length))));
    for (const pair of (sample[2] ?? "").matchAll(/([^=,\s]+)="/g)) family(base ?? name).labels.add(pair[1]!);
  }
  return [...families.values()].map((f) => ({ ...f, labels: [...f.labels] }));
}

const nonBaseUnits = /_(milliseconds|microseconds|nanoseconds|millis|ms|us|ns|minutes|hours|days|kilobytes|megabytes|gigabytes|kibibytes|mebibytes|gibibytes|bits|percent)(_|$)/;
const reservedSuffix = /_(total|count|sum|bucket|created)$/;

/** What is wrong with a family's name, help and labels; empty when nothing is. */
export function metricNameProblems(f: MetricFamily, prefix = "slotbroker_"): string[] {
  const problems: string[] = [];
  if (!/^[a-z][a-z0-9_]*$/.test(f.name)) problems.push("not lower snake_case (colons are for recording rules)");
  if (!f.name.startsWith(prefix)) problems.push(`does not start with "${prefix}"`);
  if (/__/.test(f.name) || f.name.endsWith("_")) problems.push("empty word between underscores");
  if (f.type === "counter" && !f.name.endsWith("_total")) problems.push("a counter must end in _total");
  if (f.type !== "counter" && reservedSuffix.test(f.name)) problems.push(`a ${f.type} must not end in ${reservedSuffix.exec(f.name)![0]}`);
  if (nonBaseUnits.test(f.name)) problems.push(`non-base unit "${nonBaseUnits.exec(f.name)![1]}" (use seconds, bytes, ratio)`);
  if (!["counter", "gauge", "histogram", "summary"].includes(f.type)) problems.push(`unknown type "${f.type}"`);
  if (f.help.trim() === "") problems.push("no HELP text");
  for (const label of f.labels) {
    if (!/^[a-z][a-z0-9_]*$/.test(label)) problems.push(`label "${label}" is not lower snake_case`);
    if (label === "le" && f.type !== "histogram") problems.push(`label "le" is reserved for histograms`);
    if (label === "quantile" && f.type !== "summary") problems.push(`label "quantile" is reserved for summaries`);
  }
  return problems.map((p) => `${f.name}: ${p}`);
}
