// docs/performance.md and the README's "performance at a glance" rows are generated from the
// kept benchmark runs (bench/results/*.json) and bench/goals.ts by `npm run docs:performance`:
// the committed files must be what it makes, every benchmark must state its goals, and the
// generator must say plainly what is measured, what is missed and what was never run.
import { expect } from "chai";
import { mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { benchGoals, type BenchGoals } from "../../bench/goals.js";
import type { Figure } from "../../bench/lib/figure.js";
import { glanceBegin, glanceEnd, renderGlanceBlock, renderPerformanceDoc, replaceGlanceBlock } from "../../bench/lib/performance-doc.js";
import { keptFileName, keptFilePattern, readKeptRuns, type KeptRun } from "../../bench/lib/results.js";
import { commandLine } from "../../bench/lib/run-context.js";
import { generatedFiles } from "../../scripts/performance-doc.js";
import { root } from "../integration/support.js";

const machine = { cpus: 2, model: "Test CPU", memory_bytes: 8 * 2 ** 30, platform: "linux", arch: "x64", kernel: "6.1", load_average: { start: [0.5, 0.4, 0.3] as [number, number, number], end: [0.7, 0.5, 0.3] as [number, number, number] } };

// A kept run made up for the generator's sake (these numbers were never measured).
function kept(at: string, commit: string, figures: Figure[], extra: { failed?: string[]; benches?: string[]; dirty?: boolean } = {}): KeptRun {
  const benches = extra.benches ?? [...new Set(figures.map((f) => f.bench))];
  const run = { at, finished_at: at, commit, dirty: extra.dirty ?? false, command: `npm run bench -- ${benches.join(" ")} --keep`, node: "v20.0.0", machine, benches, failed: extra.failed ?? [], figures };
  return { file: keptFileName(run, benches.join("+")), run };
}

function fig(bench: string, metric: string, value: number, baselineValue: number): Figure {
  return { bench, metric, value, baseline: "the raw thing", baseline_value: baselineValue, ratio: Math.round((value / baselineValue) * 1000) / 1000, params: {} };
}

const goals: Record<string, BenchGoals> = {
  "grant-latency": { summary: "grants", goals: [{ metric: "p50_us", on: "ratio", op: "<=", target: 1.5 }], headline: "p50_us" },
  "cycle-throughput": { summary: "cycles", goals: [{ metric: "cycles_per_s", on: "ratio", op: ">=", target: 0.6 }], headline: "cycles_per_s" },
  cancel: { summary: "cancels", goals: [] },
};
const benches = Object.keys(goals);

/** The lines of `section` (a `## name` heading) in a generated page. */
function section(doc: string, name: string): string {
  const start = doc.indexOf(`\n## ${name}\n`);
  expect(start, `section ${name}`).to.be.above(-1);
  const end = doc.indexOf("\n## ", start + 1);
  return doc.slice(start, end === -1 ? undefined : end);
}

describe("docs/performance.md", () => {
  it("is what npm run docs:performance makes from the kept runs in bench/results", () => {
    const committed = readFileSync(join(root, "docs", "performance.md"), "utf8");
    expect(committed === generatedFiles().get("docs/performance.md"), "docs/performance.md differs: run npm run docs:performance and commit").to.equal(true);
  });

  it("has its at-a-glance rows in the README generated too", () => {
    const readme = readFileSync(join(root, "README.md"), "utf8");
    expect(readme).to.include(glanceBegin).and.include(glanceEnd);
    expect(readme === generatedFiles().get("README.md"), "README.md's performance rows differ: run npm run docs:performance and commit").to.equal(true);
  });

  it("knows the goals of every benchmark in bench/, and of no other", () => {
    const files = readdirSync(join(root, "bench"))
      .filter((f) => f.endsWith(".bench.ts"))
      .map((f) => f.slice(0, -".bench.ts".length));
    expect(Object.keys(benchGoals).sort()).to.deep.equal(files.sort());
  });

  it("shows at most ten headline figures, each with a goal", () => {
    const headlines = Object.entries(benchGoals).filter(([, g]) => g.headline !== undefined);
    expect(headlines.length).to.be.at.most(10);
    for (const [bench, g] of headlines) expect(g.goals.map((x) => x.metric), bench).to.include(g.headline);
  });

  it("reads the kept runs committed in bench/results, each named by date, commit and what ran", () => {
    const names = readdirSync(join(root, "bench", "results")).filter((n) => n !== "latest.json");
    for (const name of names) expect(name, "a file in bench/results that is not a kept run").to.match(keptFilePattern);
    expect(readKeptRuns(join(root, "bench", "results")).map((r) => r.file)).to.have.members(names);
  });
});

describe("the performance page generator", () => {
  it("says so for a benchmark nobody kept a run of, in the page and in the README rows", () => {
    const input = { runs: [], benches, goals };
    const doc = renderPerformanceDoc(input);
    expect(section(doc, "grant-latency")).to.include("No kept run yet.");
    expect(doc).to.include("0 of 3 benchmarks have a kept run.");
    expect(renderGlanceBlock(input)).to.include("| `p50_us` | — | | | ratio ≤ 1.5 | no kept run yet | |");
  });

  it("shows a benchmark's newest run with its goals' verdicts, the older runs as history", () => {
    const old = kept("2026-12-01T10:00:00.000Z", "1111111aaaaaaa", [fig("grant-latency", "p50_us", 200, 100)]);
    const newer = kept("2026-12-02T10:00:00.000Z", "2222222bbbbbbb", [fig("grant-latency", "p50_us", 120, 100), fig("grant-latency", "p99_us", 900, 300)]);
    const doc = renderPerformanceDoc({ runs: [newer, old], benches, goals });
    const grants = section(doc, "grant-latency");
    expect(grants).to.include("Newest kept run: 2026-12-02 10:00 UTC, commit `2222222`");
    expect(grants).to.include("`npm run bench -- grant-latency --keep`; Node v20.0.0, 2 × Test CPU, 8.0 GiB");
    expect(grants).to.include("| `p50_us` | 120 | the raw thing | 100 | 1.2 | ratio ≤ 1.5 | met |");
    expect(grants).to.include("| `p99_us` | 900 | the raw thing | 300 | 3 | | |");
    expect(grants).to.include(`| 2026-12-01 \`1111111\` ([file](../bench/results/${old.file})) | \`p50_us\` | 200 | 100 | 2 | **missed** |`);
    expect(renderGlanceBlock({ runs: [old, newer], benches, goals })).to.include("| 120 | the raw thing: 100 | 1.2 | ratio ≤ 1.5 | met | 2026-12-02 `2222222` |");
  });

  it("falls back to the previous run when the newest one failed, and lists the failure", () => {
    const good = kept("2026-12-01T10:00:00.000Z", "1111111aaaaaaa", [fig("cycle-throughput", "cycles_per_s", 50, 100)]);
    const bad = kept("2026-12-03T10:00:00.000Z", "3333333ccccccc", [], { benches: ["cycle-throughput"], failed: ["cycle-throughput"] });
    const cycles = section(renderPerformanceDoc({ runs: [good, bad], benches, goals }), "cycle-throughput");
    expect(cycles).to.include("commit `1111111`");
    expect(cycles).to.include("| `cycles_per_s` | 50 | the raw thing | 100 | 0.5 | ratio ≥ 0.6 | **missed** |");
    expect(cycles).to.include("| 2026-12-03 `3333333` ([file](../bench/results/");
    expect(cycles).to.include("| the benchmark failed |");
  });

  it("marks a run of a tree that differed from its commit, and a goal whose figure never came", () => {
    const dirty = kept("2026-12-02T10:00:00.000Z", "4444444ddddddd", [fig("grant-latency", "p99_us", 1, 1)], { dirty: true });
    expect(dirty.file).to.equal("2026-12-02-4444444-dirty-grant-latency.json");
    const grants = section(renderPerformanceDoc({ runs: [dirty], benches, goals }), "grant-latency");
    expect(grants).to.include("commit `4444444` (the tree differed from it: dirty)");
    expect(grants).to.include("**No figure for the goal of `p50_us` in this run.**");
  });

  it("says a benchmark without a goal reports only", () => {
    const run = kept("2026-12-02T10:00:00.000Z", "5555555eeeeeee", [fig("cancel", "gone_p50_ms", 5.4, 1.9)]);
    const cancel = section(renderPerformanceDoc({ runs: [run], benches, goals }), "cancel");
    expect(cancel).to.include("No goal: it reports.");
    expect(cancel).to.include("| `gone_p50_ms` | 5.4 | the raw thing | 1.9 | 2.84 | | |");
  });

  it("replaces only the README's generated rows, and refuses a README without its markers", () => {
    const readme = `# title\n\nbefore\n${glanceBegin}\nold row\n${glanceEnd}\nafter\n`;
    expect(replaceGlanceBlock(readme, `${glanceBegin}\nnew row\n${glanceEnd}`)).to.equal(`# title\n\nbefore\n${glanceBegin}\nnew row\n${glanceEnd}\nafter\n`);
    expect(() => replaceGlanceBlock("# title\n", "x")).to.throw(/must enclose the generated rows/);
  });
});

describe("kept benchmark runs", () => {
  let dir = "";
  beforeEach(() => (dir = mkdtempSync(join(tmpdir(), "kept-runs-"))));
  afterEach(() => rmSync(dir, { recursive: true, force: true }));

  it("reads the kept runs of a directory oldest first, and leaves latest.json out", () => {
    const a = kept("2026-12-02T10:00:00.000Z", "2222222bbbbbbb", [fig("cancel", "gone_p50_ms", 1, 1)]);
    const b = kept("2026-12-01T10:00:00.000Z", "1111111aaaaaaa", [fig("cancel", "gone_p50_ms", 1, 1)]);
    for (const r of [a, b]) writeFileSync(join(dir, r.file), JSON.stringify(r.run));
    writeFileSync(join(dir, "latest.json"), "{}");
    expect(readKeptRuns(dir).map((r) => r.run.commit)).to.deep.equal(["1111111aaaaaaa", "2222222bbbbbbb"]);
  });

  it("refuses a result file with a key missing, naming the file and the key", () => {
    const { run, file } = kept("2026-12-02T10:00:00.000Z", "2222222bbbbbbb", [fig("cancel", "gone_p50_ms", 1, 1)]);
    const { machine: _machine, ...withoutMachine } = run;
    writeFileSync(join(dir, file), JSON.stringify(withoutMachine));
    expect(() => readKeptRuns(dir)).to.throw(new RegExp(`${file}: machine: `));
  });

  it("records the command as typed: the benchmarks' variables first, DATABASE_URL without its value", () => {
    const env = { npm_lifecycle_event: "bench", CONNECTIONS_SIZE: "small", DATABASE_URL: "postgres://u:secret@db/x", HOME: "/root" };
    expect(commandLine(["connections", "--keep"], env)).to.equal("CONNECTIONS_SIZE=small DATABASE_URL=… npm run bench -- connections --keep");
    expect(commandLine([], { E2E_EXEC_NODE_ARGS: "--cpu-prof --cpu-prof-dir=/tmp/p" })).to.equal("E2E_EXEC_NODE_ARGS='--cpu-prof --cpu-prof-dir=/tmp/p' tsx bench/run.ts");
  });
});
