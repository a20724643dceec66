// Runs benchmarks, each in its own process (bench/<name>.bench.ts, from one compiled build
// of the project), collects the JSON
// figure lines they print and writes bench/results/latest.json.
//   npm run bench            all of them
//   npm run bench -- NAME..  only those
import { spawn } from "node:child_process";
import { mkdirSync, readdirSync, writeFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import type { Figure } from "./lib/figure.js";
import { buildChildren, nodeScript, removeBuild } from "../harness/node-children.js";

const here = dirname(fileURLToPath(import.meta.url));
const available = readdirSync(here)
  .filter((f) => f.endsWith(".bench.ts"))
  .map((f) => f.slice(0, -".bench.ts".length))
  .sort();
const wanted = process.argv.slice(2).filter((a) => !a.startsWith("-"));
const unknown = wanted.filter((w) => !available.includes(w));
if (unknown.length > 0) {
  process.stderr.write(`unknown bench: ${unknown.join(", ")}; available: ${available.join(", ")}\n`);
  process.exit(2);
}

// Every bench and its children run from one build of the project's JavaScript.
await buildChildren();
const figures: Figure[] = [];
const failed: string[] = [];
for (const name of wanted.length > 0 ? wanted : available) {
  process.stderr.write(`\n== ${name}\n`);
  const code = await runOne(name, (line) => {
    try {
      figures.push(JSON.parse(line) as Figure);
    } catch {
      /* a non-JSON line is commentary */
    }
    process.stdout.write(`${line}\n`);
  });
  if (code !== 0) failed.push(name);
}

removeBuild();
mkdirSync(join(here, "results"), { recursive: true });
const out = { at: new Date().toISOString(), node: process.version, figures, failed };
writeFileSync(join(here, "results", "latest.json"), `${JSON.stringify(out, null, 2)}\n`);
process.stderr.write(`\nwrote bench/results/latest.json (${figures.length} figures${failed.length ? `, failed: ${failed.join(", ")}` : ""})\n`);
process.exitCode = failed.length > 0 ? 1 : 0;

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
