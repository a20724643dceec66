// docs/protocol.md's recipes for files of any size, run word for word with bash and curl
// against a real fylr and execserver (the address comes in as $API; the temp directory differs).
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { expect } from "chai";
import type pg from "pg";
import { followItem } from "../../src/api/index.js";
import { ItemState } from "../../gen/slotbroker/v1/queue_pb.js";
import { spawnExecserver, type ExecserverProcess } from "../../harness/execserver-process.js";
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
    fylr = await spawnFylr(fastFylrConfig(url, [exec.grpcAddress], { auth: { tokens: [{ name: "recipes", token: apiToken, scopes: ["submit", "read"] }] } }), "recipes", {
      credentials: { token: apiToken },
    });
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
    // As written, but for the temp directory: the fylr's address comes in as $API.
    const script = ["set -euo pipefail", ...blocks].join("\n").replaceAll("/tmp/", `${dir}/`);
    expect(script).to.not.match(/:7700|127\.0\.0\.1/);
    const r = await runCommand(["bash", "-c", script], { timeoutMs: 80_000, env: { API: fylr!.url, SLOTBROKER_API_TOKEN: apiToken } });
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

  it("serves a Range under If-Range only while the validator still matches (RFC 9110 §13.1.5), with curl", async function () {
    this.timeout(60_000);
    const submitted = await fylr!.client.submit({ calls: [{ service: "cat", stdin: { case: "stdinData", value: Buffer.from("0123456789") } }] });
    const item = await followItem(fylr!.client, submitted.item!.id);
    expect(item.state).to.equal(ItemState.SUCCEEDED);
    const url = `${fylr!.url}/queue/items/${item.id}/output`;
    const get = async (...headers: string[]): Promise<{ status: number; body: string; head: string }> => {
      const r = await runCommand(["curl", "-sS", "-D", "-", "-r", "2-4", "-H", `authorization: Bearer ${apiToken}`, ...headers.flatMap((h) => ["-H", h]), url]);
      expect(r.code, r.stderr).to.equal(0);
      const text = r.stdout.toString();
      const cut = text.indexOf("\r\n\r\n");
      const head = text.slice(0, cut);
      return { status: Number(/^HTTP\/1\.1 (\d+)/.exec(head)![1]), head, body: text.slice(cut + 4) };
    };
    const plain = await get();
    expect([plain.status, plain.body]).to.deep.equal([206, "234"]);
    const etag = /^etag: (.+)$/im.exec(plain.head)![1]!.trim();
    const lastModified = /^last-modified: (.+)$/im.exec(plain.head)![1]!.trim();
    expect(new Date(lastModified).getTime()).to.be.closeTo(Date.now(), 60_000);
    // The validator still matches: the range.
    expect(await get(`If-Range: ${etag}`)).to.include({ status: 206, body: "234" });
    expect(await get(`If-Range: ${lastModified}`)).to.include({ status: 206, body: "234" });
    // It does not (another tag, a weak tag, another date, not a validator): the whole body, 200.
    const older = new Date(Date.parse(lastModified) - 60_000).toUTCString();
    for (const value of ['"0000"', `W/${etag}`, older, "tomorrow"]) {
      const whole = await get(`If-Range: ${value}`);
      expect([whole.status, whole.body], value).to.deep.equal([200, "0123456789"]);
      expect(whole.head, value).to.not.match(/^content-range:/im);
    }
  });
});
