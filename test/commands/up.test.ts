// `slotbroker up` as a child process: it comes up, `submit --wait` prints the right digest,
// `status` prints tables, and SIGTERM stops everything, Postgres included.
import { expect } from "chai";
import { createHash } from "node:crypto";
import { chmodSync, existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { createServer, type Server } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { ItemState } from "../../gen/slotbroker/v1/queue_pb.js";
import { createQueueClient } from "../../src/api/index.js";
import { waitFor } from "../../harness/execserver-process.js";
import { createTestDatabase } from "../support/postgres.js";
import { release } from "../../harness/resources.js";
import { descendants, startUp } from "../support/up-process.js";
import { root, runCommand, slotbroker } from "../integration/support.js";

/** Running, and not a zombie waiting to be reaped (Linux /proc). */
function alive(pid: number): boolean {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
    return stat.slice(stat.lastIndexOf(")") + 2, stat.lastIndexOf(")") + 3) !== "Z";
  } catch {
    return false;
  }
}

describe("slotbroker up", () => {
  let dir: string;
  let input: string;
  let stateFile: string;
  const content = Buffer.from(`slotbroker up test ${Date.now()}\n`);
  const digest = createHash("sha256").update(content).digest("hex");

  beforeEach(() => {
    dir = mkdtempSync(join(tmpdir(), "slotbroker-up-"));
    chmodSync(dir, 0o755); // the embedded server runs as "postgres" when we are root
    input = join(dir, "input.txt");
    stateFile = join(dir, "state", "up.json");
    writeFileSync(input, content);
  });
  afterEach(() => {
    rmSync(dir, { recursive: true, force: true });
  });

  it("brings the stack up on a database, runs submit --wait and status, and stops on SIGTERM", async function () {
    this.timeout(120_000);
    const databaseUrl = await createTestDatabase("up");
    const up = await startUp({ ...process.env, DATABASE_URL: databaseUrl, SLOTBROKER_STATE_FILE: stateFile });
    try {
      expect(up.banner).to.match(/services: .*\bsha256sum\b/).and.to.match(/services: .*\bnoop\b/);
      const submitted = await slotbroker(["submit", "--api", up.api, "--service", "sha256sum", "--stdin", input, "--wait"]);
      expect(submitted.code, submitted.stderr).to.equal(0);
      expect(submitted.stdout.toString()).to.equal(`${digest}  -\n`);
      expect(submitted.stderr).to.match(/calls\[0\] sha256sum: exit 0/);

      // Without --api, status and submit find the stack through the state file `up` wrote.
      const found = { env: { SLOTBROKER_STATE_FILE: stateFile, SLOTBROKER_API: "" } };
      expect(JSON.parse(readFileSync(stateFile, "utf8"))).to.deep.include({ api: up.api, execserver: up.grpc });
      const plain = await slotbroker(["submit", "--service", "wc", "--arg=-c", "--stdin", input, "--wait"], found);
      expect(plain.code, plain.stderr).to.equal(0);
      expect(plain.stdout.toString().trim()).to.equal(String(content.length));
      expect(up.banner).to.contain(`export SLOTBROKER_API=${up.api}`);

      // docs/protocol.md's first recipe finds the stack's addresses (ports picked by
      // --port-base 0) in the same state file; its grpcurl and curl recipes then use them.
      const doc = readFileSync(join(root, "docs/protocol.md"), "utf8");
      const setup = /```sh\n(STATE=[\s\S]*?)```/.exec(doc)![1]!;
      const addresses = await runCommand(["bash", "-c", `set -euo pipefail\n${setup}\nfor url in "$API/healthz" "$ADMIN/healthz"; do curl -sf -o /dev/null -w '%{http_code}\\n' "$url"; done`], { env: { SLOTBROKER_STATE_FILE: stateFile } });
      expect(addresses.stdout.toString().split("\n").slice(0, 3), addresses.stderr).to.deep.equal([`API=${up.api} EXEC=${up.grpc} ADMIN=${up.admin}`, "200", "200"]);

      const status = await slotbroker(["status"], found);
      expect(status.code, status.stderr).to.equal(0);
      expect(status.stdout.toString()).to.match(/^WAITGROUP +SLOTS +RUNNING +OFFERED +FREE +WAITING +DONE +MEAN RUNTIME$/m);
      expect(status.stdout.toString()).to.match(/^text +\d+ +0 +0 +\d+ +0 +2 /m);
      expect(status.stdout.toString()).to.match(/^KIND +QUEUED +CLAIMED +RUNNING$/m);

      const children = await descendants(up.child.pid!);
      expect(children, "the stack runs in a supervised child").to.not.deep.equal([]);
      expect(await up.stop()).to.equal(0);
      expect(children.filter(alive), "processes left behind").to.deep.equal([]);
      expect(existsSync(stateFile), "the state file goes with the stack").to.equal(false);
    } finally {
      await release(up);
    }
  });

  it("runs its own Postgres when DATABASE_URL is unset, keeps the data between runs, and stops in order on Ctrl-C", async function () {
    this.timeout(180_000);
    const dataDir = join(dir, "pgdata");
    const env: NodeJS.ProcessEnv = { ...process.env, SLOTBROKER_DATA_DIR: dataDir, SLOTBROKER_STATE_FILE: stateFile };
    delete env.DATABASE_URL;
    const first = await startUp(env, true);
    let id: string;
    let slow: string;
    try {
      expect(first.banner).to.match(/postgres +postgres:\/\/\S+ +\(embedded, data in /);
      const submitted = await slotbroker(["submit", "--api", first.api, "--service", "sha256sum", "--stdin", input, "--wait", "--json"]);
      expect(submitted.code, submitted.stderr).to.equal(0);
      const item = JSON.parse(submitted.stdout.toString()) as { id: string; output: string };
      id = item.id;
      expect(Buffer.from(item.output, "base64").toString()).to.equal(`${digest}  -\n`);
      expect(existsSync(join(dataDir, "postmaster.pid"))).to.equal(true);
      const children = await descendants(first.child.pid!);
      expect(children.length, "the stack and its Postgres").to.be.at.least(2);
      const running = await slotbroker(["submit", "--api", first.api, "--service", "sleep", "--arg", "1.5"]);
      slow = running.stdout.toString().trim();
      await waitFor("the sleep to run", async () => (await createQueueClient(first.api).get({ id: slow })).item?.state === ItemState.RUNNING);
      // Ctrl-C in a terminal: SIGINT to the whole foreground process group.
      const exited = new Promise<number | null>((done) => first.child.once("exit", (code) => done(code)));
      process.kill(-first.child.pid!, "SIGINT");
      expect(await exited).to.equal(0);
      expect(children.filter(alive), "processes left behind").to.deep.equal([]);
      expect(existsSync(join(dataDir, "postmaster.pid")), "Postgres still running").to.equal(false);
    } finally {
      await release(first);
    }
    const second = await startUp(env);
    try {
      const { item } = await createQueueClient(second.api).get({ id });
      expect(item?.state).to.equal(ItemState.SUCCEEDED);
      // The fylr finished the running item before Postgres went down.
      const { item: finished } = await createQueueClient(second.api).get({ id: slow });
      expect(finished?.state, finished?.error).to.equal(ItemState.SUCCEEDED);
      expect(finished?.attempts).to.equal(1);
      expect(await second.stop()).to.equal(0);
      await waitFor("postmaster.pid to go", () => !existsSync(join(dataDir, "postmaster.pid")), 5000);
    } finally {
      await release(second);
    }
  });

  it("says which port is taken and exits non-zero", async function () {
    this.timeout(60_000);
    const server: Server = createServer();
    await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
    const port = (server.address() as { port: number }).port;
    try {
      const result = await slotbroker(["up", "--port-base", "0", "--fylr-port", String(port)], { env: { DATABASE_URL: "postgres://unused@127.0.0.1:1/x" } });
      expect(result.code).to.equal(1);
      expect(result.stderr).to.include(`port ${port} on 127.0.0.1 (fylr) is already in use`);
      expect(result.stderr).to.include("--port-base");
    } finally {
      await new Promise((resolve) => server.close(resolve));
    }
  });
});
