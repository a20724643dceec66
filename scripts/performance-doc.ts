// Regenerates docs/performance.md and the README's "performance at a glance" rows from the
// kept benchmark runs (bench/results/*.json) and the goals (bench/goals.ts).
//   npm run docs:performance             rewrite both
//   npm run docs:performance -- --check  exit 1 naming the file that differs (writes nothing)
import { readdirSync, readFileSync, writeFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { benchGoals } from "../bench/goals.js";
import { renderGlanceBlock, renderPerformanceDoc, replaceGlanceBlock, type PerformanceInput } from "../bench/lib/performance-doc.js";
import { readKeptRuns } from "../bench/lib/results.js";

const root = join(dirname(fileURLToPath(import.meta.url)), "..");

/** The kept runs, the benchmarks and their goals, as this checkout has them. */
export function performanceInput(dir = root): PerformanceInput {
  const benches = readdirSync(join(dir, "bench"))
    .filter((f) => f.endsWith(".bench.ts"))
    .map((f) => f.slice(0, -".bench.ts".length))
    .sort();
  return { runs: readKeptRuns(join(dir, "bench", "results")), benches, goals: benchGoals };
}

/** What the two generated files should hold: path (from the root) → text. */
export function generatedFiles(dir = root): Map<string, string> {
  const input = performanceInput(dir);
  const readme = readFileSync(join(dir, "README.md"), "utf8");
  return new Map([
    ["docs/performance.md", renderPerformanceDoc(input)],
    ["README.md", replaceGlanceBlock(readme, renderGlanceBlock(input))],
  ]);
}

function main(args: readonly string[]): number {
  const check = args.includes("--check");
  const stale: string[] = [];
  for (const [path, text] of generatedFiles()) {
    let current = "";
    try {
      current = readFileSync(join(root, path), "utf8");
    } catch {
      /* not there yet */
    }
    if (current === text) continue;
    stale.push(path);
    if (!check) writeFileSync(join(root, path), text);
  }
  if (check && stale.length > 0) {
    process.stderr.write(`${stale.join(", ")}: not what npm run docs:performance makes from bench/results; run it and commit\n`);
    return 1;
  }
  process.stderr.write(stale.length > 0 ? `rewrote ${stale.join(", ")}\n` : "docs/performance.md and README.md are up to date\n");
  return 0;
}

if (process.argv[1] && fileURLToPath(import.meta.url) === process.argv[1]) process.exitCode = main(process.argv.slice(2));
