// docs/protocol.md's recipes for files of any size, run word for word with bash and curl
// against a real fylr and execserver (only the address and the temp directory differ).
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { expect } from "chai";
import type pg from "pg";
import { spawnExecserver, type ExecserverProcess } from "../support/execserver-process.js";
import { createTestDatabase } from "../support/postgres.js";
import { closeAll, fastFylrConfig, openPool, root, runCommand, spawnFylr, type FylrProcess } from "./support.js";

const apiToken = "recipes-api-token-0123456789";

describe("docs/protocol.md: files of any size with curl", () => {
  let exec: ExecserverProcess | undefined;
  let fylr: FylrProcess | undefined;
  let pool: pg.Pool | undefined;
  let dir: string;

  before(async function () {
    this.timeout(90_000);
    const url = await createTestDatabase("recipes");
    pool = openPool(url);
    dir = mkdtempSync(join(tmpdir(), "slotbroker-recipes-"));
    exec = await spawnExecserver({ instanceId: "exec-recipes", waitgroups: { files: { processes: 2 } }, services: { cat: { waitgroup: "files", command: ["cat"] } } });
    // The recipes send $SLOTBROKER_API_TOKEN: the fylr requires it.
    fylr = await spawnFylr(fastFylrConfig(url, [exec.grpcAddress], { auth: { tokens: [{ name: "recipes", token: apiToken, scopes: ["submit", "read"] }] } }), "recipes");
  });
  after(async () => {
    await closeAll(fylr, exec, pool);
    rmSync(dir, { recursive: true, force: true });
  });

  it("uploads, submits with stdinUpload, and fetches the whole output, a range and its digest", async function () {
    this.timeout(90_000);
    const doc = readFileSync(join(root, "docs/protocol.md"), "utf8");
    const section = doc.slice(doc.indexOf("\n## Files of any size"));
    const blocks = [...section.matchAll(/```sh\n([\s\S]*?)```/g)].map((m) => m[1]!);
    expect(blocks.length).to.equal(3);
    const address = fylr!.url.replace(/^http:\/\//, "");
    const script = ["set -euo pipefail", ...blocks].join("\n").replaceAll("127.0.0.1:7700", address).replaceAll("/tmp/", `${dir}/`);
    expect(script).to.not.include("7700");
    const r = await runCommand(["bash", "-c", script], { timeoutMs: 80_000, env: { SLOTBROKER_API_TOKEN: apiToken } });
    expect(r.code, r.stderr).to.equal(0);
    const lines = r.stdout.toString().trim().split("\n");
    expect(lines[0]).to.match(/^uploaded [0-9a-f-]{36}$/);
    expect(lines[1]).to.match(/^done [0-9a-f-]{36}$/);
    expect(lines.slice(2, 4)).to.deep.equal(["identical", "1000"]);
    expect(lines[4]).to.match(/^etag: "[0-9a-f]{64}"\s*$/i);
    const stored = await pool!.query<{ role: string; n: number }>("SELECT role, count(*)::int AS n FROM blobs GROUP BY role ORDER BY role");
    expect(stored.rows).to.deep.equal([
      { role: "input", n: 1 },
      { role: "output", n: 1 },
    ]);
  });
});
