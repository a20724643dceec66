// The embedded PostgreSQL from a private (chmod 700) tree: as root the server runs as the
// "postgres" user, which can reach neither the binaries nor the data in such a tree.
import { expect } from "chai";
import { chmodSync, cpSync, existsSync, lstatSync, mkdirSync, mkdtempSync, readdirSync, rmSync, unlinkSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import pg from "pg";
import { startEmbeddedPostgres } from "../../src/shared/embedded-postgres.js";
import { copyPostgresBinaries, findPackage, type PostgresPackage } from "../../src/shared/postgres-binaries.js";

const root = process.getuid?.() === 0;

describe("embedded PostgreSQL from a private directory", function () {
  this.timeout(120_000);
  let dir: string;
  let privateDir: string;
  let source: PostgresPackage;

  before(async () => {
    dir = mkdtempSync(join(tmpdir(), "slotbroker-pgbin-"));
    chmodSync(dir, 0o755);
    privateDir = join(dir, "private");
    mkdirSync(privateDir, { mode: 0o700 });
    chmodSync(privateDir, 0o700);
    // The package as npm leaves it when its install script did not run: no library links.
    const installed = await findPackage();
    const nativeDir = join(privateDir, "native");
    cpSync(installed.nativeDir, nativeDir, { recursive: true, verbatimSymlinks: true });
    for (const name of readdirSync(join(nativeDir, "lib"))) {
      if (lstatSync(join(nativeDir, "lib", name)).isSymbolicLink()) unlinkSync(join(nativeDir, "lib", name));
    }
    source = { nativeDir, version: `${installed.version}-test` };
  });
  after(() => rmSync(dir, { recursive: true, force: true }));

  it("copies the binaries to a reachable cache, restores their library links, and serves queries", async () => {
    const binaries = await copyPostgresBinaries(source, join(dir, "cache"), root ? { uid: -1, gid: -1 } : undefined);
    expect(binaries.dir).to.equal(join(dir, "cache", `postgres-${source.version}-${process.platform}-${process.arch}`));
    expect(lstatSync(join(binaries.dir, "lib", "libpq.so.5")).isSymbolicLink()).to.equal(true);
    const server = await startEmbeddedPostgres({ dataDir: join(dir, "data"), persistent: false, binaries });
    try {
      const client = new pg.Client(server.url);
      await client.connect();
      try {
        const { rows } = await client.query<{ user: string }>("select current_user as user");
        expect(rows[0]!.user).to.equal("postgres");
      } finally {
        await client.end();
      }
    } finally {
      await server.stop();
    }
    expect(existsSync(join(dir, "data")), "not persistent: data removed").to.equal(false);
    // The second use finds the finished copy.
    expect((await copyPostgresBinaries(source, join(dir, "cache"), undefined)).dir).to.equal(binaries.dir);
  });

  it("names the data directory the server's user cannot reach, and how to choose another", async () => {
    const binaries = await copyPostgresBinaries(source, join(dir, "cache"), undefined);
    const attempt = startEmbeddedPostgres({ dataDir: join(privateDir, "data"), persistent: false, binaries });
    if (!root) {
      // Not root: the server runs as this user, who reaches its own private directory.
      await (await attempt).stop();
      return;
    }
    const err = await attempt.then(
      () => undefined,
      (e: unknown) => e as Error,
    );
    expect(err?.message).to.contain(`cannot reach its data directory ${join(privateDir, "data")}`).and.to.contain("--data-dir");
  });

  it("rejects with a message, not an unhandled 'error' event, when the binaries cannot be run", async () => {
    const binaries = { initdb: join(privateDir, "native", "bin", "initdb"), postgres: join(privateDir, "native", "bin", "postgres"), version: "x", dir: privateDir };
    const attempt = startEmbeddedPostgres({ dataDir: join(dir, "data-direct"), persistent: false, binaries });
    if (!root) {
      // Not root: the binaries run as this user, but their library links are missing.
      const err = await attempt.then(() => undefined, (e: unknown) => e as Error);
      expect(err?.message).to.match(/initdb failed|exited during start-up/);
      return;
    }
    const err = await attempt.then(() => undefined, (e: unknown) => e as Error);
    expect(err?.message).to.match(/cannot run .*initdb as the "postgres" user .*EACCES/);
  });
});
