// docs/operator-guide.md against the code: every config key of the execserver and the fylr
// in its table with the schema's default, no documented key the schema lacks, and every
// environment variable the code reads in the environment table.
import { expect } from "chai";
import { readFileSync, readdirSync } from "node:fs";
import { join } from "node:path";
import { fylrConfigSchema } from "../../src/app/index.js";
import { execserverConfigSchema } from "../../src/execserver/index.js";
import { schemaKeys, type SchemaKey } from "../../src/shared/config-parsing.js";
import { root } from "../integration/support.js";

const guide = readFileSync(join(root, "docs", "operator-guide.md"), "utf8");

/** The rows of the key tables in a `## heading` section: key → default cell. */
function documentedKeys(heading: string): Map<string, string> {
  const start = guide.indexOf(`\n## ${heading}\n`);
  expect(start, `section "## ${heading}"`).to.be.above(-1);
  const end = guide.indexOf("\n## ", start + 1);
  const rows = new Map<string, string>();
  for (const m of guide.slice(start, end === -1 ? undefined : end).matchAll(/^\| `([^`]+)` \| ([^|]*) \|/gm)) rows.set(m[1]!, m[2]!.trim());
  return rows;
}

// How a default is written in the guide: `5s`, `100000`, `[]`.
function written(value: unknown): string {
  return `\`${typeof value === "string" ? value : JSON.stringify(value)}\``;
}

function check(keys: readonly SchemaKey[], rows: Map<string, string>, prefix = ""): string[] {
  const problems: string[] = [];
  const paths = new Set(keys.map((k) => k.path));
  for (const key of keys) {
    if (key.type === "object") continue; // a section; its keys are checked one by one
    const ancestors = key.path.split(".").map((_, i, parts) => parts.slice(0, i).join(".")).filter(Boolean);
    const row = rows.get(key.path);
    if (row === undefined) {
      if (!ancestors.some((a) => rows.has(a) && keys.find((k) => k.path === a)?.type === "object")) problems.push(`${prefix}${key.path}: not documented`);
      continue;
    }
    if (key.defaultValue !== undefined && !row.includes(written(key.defaultValue))) {
      problems.push(`${prefix}${key.path}: the guide says "${row}", the default is ${written(key.defaultValue)}`);
    }
  }
  for (const documented of rows.keys()) if (!paths.has(documented)) problems.push(`${prefix}${documented}: documented, but not a config key`);
  return problems;
}

function sourceFiles(dir: string): string[] {
  return readdirSync(dir, { withFileTypes: true }).flatMap((e) => (e.isDirectory() ? sourceFiles(join(dir, e.name)) : e.name.endsWith(".ts") ? [join(dir, e.name)] : []));
}

describe("docs/operator-guide.md", () => {
  it("documents every execserver config key with its default", () => {
    const keys = schemaKeys(execserverConfigSchema);
    expect(keys.length).to.be.above(10);
    expect(check(keys, documentedKeys("The execserver"))).to.deep.equal([]);
  });

  it("documents every fylr config key, the execserver and dispatcher sections included, with its default", () => {
    const keys = schemaKeys(fylrConfigSchema);
    expect(keys.map((k) => k.path)).to.include.members(["execserver.positionInterval", "execserver.keepaliveTime", "dispatcher.maxClaimBatch"]);
    expect(check(keys, documentedKeys("The fylr"))).to.deep.equal([]);
  });

  it("documents every environment variable the code reads", () => {
    // Set by `up` for its own child, and by the execserver for its native job launcher.
    const internal = new Set(["SLOTBROKER_UP_SUPERVISED", "SLOTBROKER_REAPER_FD"]);
    // TMPDIR: read through os.tmpdir() (where the execserver's jobs get their directories).
    const used = new Set<string>(["DATABASE_URL", "TMPDIR"]);
    for (const file of sourceFiles(join(root, "src"))) for (const m of readFileSync(file, "utf8").matchAll(/\bSLOTBROKER_[A-Z_]+\b/g)) used.add(m[0]);
    const documented = documentedKeys("Environment variables");
    const missing = [...used].filter((name) => !internal.has(name) && !documented.has(name));
    expect(missing).to.deep.equal([]);
    expect([...documented.keys()].filter((name) => !used.has(name)), "documented but unused").to.deep.equal([]);
  });

  it("catches an undocumented key, a wrong default and a stale row", () => {
    const keys: SchemaKey[] = [
      { path: "a", type: "string", defaultValue: "5s" },
      { path: "b", type: "number", defaultValue: 3 },
      { path: "tls", type: "object", defaultValue: undefined },
      { path: "tls.certFile", type: "string", defaultValue: undefined },
    ];
    const rows = new Map([
      ["a", "`10s`"],
      ["tls", "none"],
      ["gone", "`1`"],
    ]);
    expect(check(keys, rows)).to.deep.equal(['a: the guide says "`10s`", the default is `5s`', "b: not documented", "gone: documented, but not a config key"]);
  });
});
