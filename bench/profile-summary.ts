// Summarises a V8 .cpuprofile (node --cpu-prof): the frames with the most self time and the
// most inclusive time, in ms and as a share of the busy (non-idle) samples.
//   npx tsx bench/profile-summary.ts FILE.cpuprofile [TOP=30] [FILTER]
// FILTER keeps frames whose "name file:line" contains it. The samples are wall-clock: on a
// busy machine a frame that waits (a blocking syscall, a descheduled thread) counts too.
import { readFileSync } from "node:fs";
import { pathToFileURL } from "node:url";

interface ProfileNode {
  readonly id: number;
  readonly callFrame: { readonly functionName: string; readonly url: string; readonly lineNumber: number };
  readonly children?: readonly number[];
}
interface CpuProfile {
  readonly nodes: readonly ProfileNode[];
  readonly samples: readonly number[];
  readonly timeDeltas: readonly number[];
}

export interface ProfileSummary {
  readonly totalMs: number;
  readonly idleMs: number;
  readonly self: Map<string, number>;
  readonly inclusive: Map<string, number>;
}

/** "name file:line" of a frame; node_modules paths keep the package and file. */
export function frameKey(frame: ProfileNode["callFrame"]): string {
  const file = frame.url.includes("node_modules/") ? frame.url.slice(frame.url.lastIndexOf("node_modules/") + 13) : frame.url.replace(/^.*\//, "");
  return `${frame.functionName || "(anonymous)"} ${file}:${frame.lineNumber + 1}`;
}

/** Self and inclusive ms per frame key (a recursive frame counts once per sample). */
export function summarise(profile: CpuProfile): ProfileSummary {
  const byId = new Map(profile.nodes.map((n) => [n.id, n]));
  const parent = new Map<number, number>();
  for (const n of profile.nodes) for (const c of n.children ?? []) parent.set(c, n.id);
  const self = new Map<string, number>();
  const inclusive = new Map<string, number>();
  let totalMs = 0;
  let idleMs = 0;
  // timeDeltas[i] is the gap before sample i; the gap after it is the time it stands for.
  for (let i = 0; i < profile.samples.length; i++) {
    const ms = (profile.timeDeltas[i + 1] ?? 0) / 1000;
    const leaf = byId.get(profile.samples[i]!)!;
    totalMs += ms;
    if (leaf.callFrame.functionName === "(idle)") {
      idleMs += ms;
      continue;
    }
    const leafKey = frameKey(leaf.callFrame);
    self.set(leafKey, (self.get(leafKey) ?? 0) + ms);
    const seen = new Set<string>();
    for (let id: number | undefined = leaf.id; id !== undefined; id = parent.get(id)) {
      const key = frameKey(byId.get(id)!.callFrame);
      if (seen.has(key)) continue;
      seen.add(key);
      inclusive.set(key, (inclusive.get(key) ?? 0) + ms);
    }
  }
  return { totalMs, idleMs, self, inclusive };
}

function main(args: string[]): void {
  const [file, top = "30", filter = ""] = args;
  if (!file) {
    process.stderr.write("usage: npx tsx bench/profile-summary.ts FILE.cpuprofile [TOP=30] [FILTER]\n");
    process.exitCode = 2;
    return;
  }
  const s = summarise(JSON.parse(readFileSync(file, "utf8")) as CpuProfile);
  const busy = s.totalMs - s.idleMs;
  process.stdout.write(`${file}: ${s.totalMs.toFixed(0)} ms sampled, ${s.idleMs.toFixed(0)} ms idle, ${busy.toFixed(0)} ms busy\n`);
  for (const [title, frames] of [
    ["self", s.self],
    ["inclusive", s.inclusive],
  ] as const) {
    process.stdout.write(`\n${title}:\n`);
    const rows = [...frames].filter(([key]) => key.includes(filter)).sort((a, b) => b[1] - a[1]);
    for (const [key, ms] of rows.slice(0, Number(top))) {
      process.stdout.write(`${ms.toFixed(0).padStart(8)} ms ${((100 * ms) / busy).toFixed(1).padStart(5)} %  ${key}\n`);
    }
  }
}

if (import.meta.url === pathToFileURL(process.argv[1] ?? "").href) {
  // Piped into head: the reader left, so the rest is not wanted.
  process.stdout.on("error", (err: NodeJS.ErrnoException) => {
    if (err.code !== "EPIPE") throw err;
    process.exit(0);
  });
  main(process.argv.slice(2));
}
