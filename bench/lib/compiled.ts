// Plain JavaScript for a benchmark's child processes: src/, gen/ and bench/lib/ transpiled
// file by file (esbuild, no bundling, no type check) into bench/.build/, with the files the
// code reads next to itself (SQL migrations, descriptor sets) copied alongside. A child run
// from there starts with plain `node`, as a deployed build does, instead of through tsx,
// whose loader thread is a second V8 isolate in every process (more memory, so every
// fork() of a job costs more).
import { cpSync, existsSync, readdirSync, rmSync } from "node:fs";
import { dirname, join, relative } from "node:path";
import { fileURLToPath } from "node:url";
import { build } from "esbuild";

const root = join(dirname(fileURLToPath(import.meta.url)), "..", "..");
const outRoot = join(root, "bench", ".build");
const trees = ["src", "gen", join("bench", "lib")];

function typescriptFiles(dir: string): string[] {
  const out: string[] = [];
  for (const entry of readdirSync(dir, { withFileTypes: true })) {
    const path = join(dir, entry.name);
    if (entry.isDirectory()) out.push(...typescriptFiles(path));
    else if (entry.name.endsWith(".ts") && !entry.name.endsWith(".d.ts")) out.push(path);
  }
  return out;
}

/** Transpiles the trees into bench/.build/ (about a second) and returns that directory. */
export async function compileForChildren(): Promise<string> {
  rmSync(outRoot, { recursive: true, force: true });
  const entryPoints = trees.flatMap((t) => typescriptFiles(join(root, t)));
  await build({ entryPoints, outdir: outRoot, outbase: root, format: "esm", platform: "node", target: "node20", logLevel: "warning" });
  for (const t of ["src", "gen"]) {
    cpSync(join(root, t), join(outRoot, t), { recursive: true, filter: (p) => !p.endsWith(".ts") });
  }
  return outRoot;
}

/** Where the transpiled copy of a .ts file under the project lives (after compileForChildren). */
export function compiledPath(tsPath: string): string {
  const rel = relative(root, tsPath);
  if (rel.startsWith("..") || !rel.endsWith(".ts")) throw new Error(`${tsPath}: not a TypeScript file of this project`);
  const js = join(outRoot, rel.replace(/\.ts$/, ".js"));
  if (!existsSync(js)) throw new Error(`${js} is missing: call compileForChildren() first`);
  return js;
}
