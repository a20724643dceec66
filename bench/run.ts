// Runs benchmarks, each in its own process (bench/<name>.bench.ts, all from one compiled
// build of the project: harness/node-children.ts), collects the JSON
// figure lines they print and writes bench/results/latest.json: the figures plus the date,
// commit, machine, Node version and command of the run (bench/lib/results.ts).
//   npm run bench                     all of them
//   npm run bench -- NAME..           only those
//   npm run bench -- --keep [NAME..]  also keep the run as bench/results/YYYY-MM-DD-<commit>-<what>.json
//                                     (<what>: the names joined by +, or "all"; --keep=LABEL names it)
// A kept run is committed; `npm run docs:performance` then regenerates docs/performance.md.
import { spawn } from "node:child_process";
import { existsSync, mkdirSync, readdirSync, writeFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import type { Figure } from "./lib/figure.js";
import { isFigure, keptFileName, type RunRecord } from "./lib/results.js";
import { commandLine, gitState, loadAverage, machine } from "./lib/run-context.js";
import { buildChildren, nodeScript, removeBuild } from "../harness/node-children.js";

const here = dirname(fileURLToPath(import.meta.url));
const available = readdirSync(here)
  .filter((f) => f.endsWith(".bench.ts"))
  .map((f) => f.slice(0, -".bench.ts".length))
  .sort();
const args = process.argv.slice(2);
const wanted = args.filter((a) => !a.startsWith("-"));
const flags = args.filter((a) => a.startsWith("-"));
const badFlags = flags.filter((f) => f !== "--keep" && !/^--keep=[A-Za-z0-9+._-]+$/.test(f));
const unknown = wanted.filter((w) => !available.includes(w));
if (badFlags.length > 0 || unknown.length > 0) {
  if (badFlags.length > 0) process.stderr.write(`unknown option: ${badFlags.join(", ")}; known: --keep, --keep=LABEL (letters, digits, + . _ -)\n`);
  if (unknown.length > 0) process.stderr.write(`unknown bench: ${unknown.join(", ")}; available: ${available.join(", ")}\n`);
  process.exit(2);
}
const keep = flags.find((f) => f.startsWith("--keep"));
const benches = wanted.length > 0 ? wanted : available;

const at = new Date().toISOString();
const loadAtStart = loadAverage();
const root = join(here, "..");
const { commit, dirty } = gitState(root);
const command = commandLine(args, process.env);
if (dirty) process.stderr.write("note: the working tree differs from the commit; the run is recorded as dirty\n");

// Every bench and its children run from one build of the project's JavaScript, file by
// file as a deployment runs it (no bundle).
await buildChildren({ bundle: false });
const figures: Figure[] = [];
const failed: string[] = [];
for (const name of benches) {
  process.stderr.write(`\n== ${name}\n`);
  const code = await runOne(name, (line) => {
    try {
      const json: unknown = JSON.parse(line);
      if (isFigure(json)) figures.push(json);
    } catch {
      /* a non-JSON line is commentary */
    }
    process.stdout.write(`${line}\n`);
  });
  if (code !== 0) failed.push(name);
}

removeBuild();
const run: RunRecord = {
  at,
  finished_at: new Date().toISOString(),
  commit,
  dirty,
  command,
  node: process.version,
  machine: machine(loadAtStart),
  benches,
  failed,
  figures,
};
const results = join(here, "results");
mkdirSync(results, { recursive: true });
const text = `${JSON.stringify(run, null, 2)}\n`;
writeFileSync(join(results, "latest.json"), text);
process.stderr.write(`\nwrote bench/results/latest.json (${figures.length} figures${failed.length ? `, failed: ${failed.join(", ")}` : ""})\n`);
if (keep) {
  const what = keep.startsWith("--keep=") ? keep.slice("--keep=".length) : wanted.length > 0 ? wanted.join("+") : "all";
  const file = freeName(results, keptFileName(run, what));
  writeFileSync(join(results, file), text);
  process.stderr.write(`kept as bench/results/${file}: commit it, then run npm run docs:performance\n`);
}
process.exitCode = failed.length > 0 ? 1 : 0;

/** `name`, or `name` with -2, -3, … before .json when a kept run of that name exists. */
function freeName(dir: string, name: string): string {
  let candidate = name;
  for (let n = 2; existsSync(join(dir, candidate)); n++) candidate = name.replace(/\.json$/, `-${n}.json`);
  return candidate;
}

function runOne(name: string, onLine: (line: string) => void): Promise<number> {
  return new Promise((resolve) => {
    const child = spawn(process.execPath, [...nodeScript(join(here, `${name}.bench.ts`))], {
      stdio: ["ignore", "pipe", "inherit"],
      env: { ...process.env, SLOTBROKER_LOG_LEVEL: process.env.SLOTBROKER_LOG_LEVEL ?? "silent" },
    });
    let rest = "";
    child.stdout.setEncoding("utf8");
    child.stdout.on("data", (chunk: string) => {
      const lines = (rest + chunk).split("\n");
      rest = lines.pop() ?? "";
      lines.forEach(onLine);
    });
    child.on("close", (code) => {
      if (rest) onLine(rest);
      resolve(code ?? 1);
    });
  });
}
