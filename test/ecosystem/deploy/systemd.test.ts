// deploy/systemd: both units keep `systemd-analyze security`'s exposure at or below the
// target, offline (no systemd needed). That they still run — jobs spawned, a clean stop —
// under the real service manager with this sandbox is test/ecosystem/package/pack.test.ts's job.
import { expect } from "chai";
import { execFile } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { promisify } from "node:util";
import { root } from "../../integration/support.js";

const target = 2.0;

async function exposure(unit: string): Promise<{ score: number; out: string }> {
  const { stdout } = await promisify(execFile)("systemd-analyze", ["security", "--offline=yes", "--no-pager", unit], { timeout: 60_000 });
  const found = /Overall exposure level for \S+: (\d+\.\d+)/.exec(stdout);
  if (!found) throw new Error(`no exposure level in: ${stdout.slice(-500)}`);
  return { score: Number(found[1]), out: stdout };
}

describe("deploy/systemd", function () {
  this.timeout(120_000);

  for (const name of ["slotbroker-execserver.service", "slotbroker-fylr.service"]) {
    it(`${name}: systemd-analyze security scores at most ${target}`, async () => {
      const { score, out } = await exposure(join(root, "deploy", "systemd", name));
      expect(score, out.split("\n").filter((l) => l.startsWith("✗")).join("\n")).to.be.at.most(target);
    });
  }

  it("the score would show a unit without its sandbox", async () => {
    const temp = mkdtempSync(join(tmpdir(), "slotbroker-systemd-"));
    try {
      const text = readFileSync(join(root, "deploy", "systemd", "slotbroker-fylr.service"), "utf8");
      const bare = join(temp, "slotbroker-fylr.service");
      writeFileSync(bare, text.slice(0, text.indexOf("# Sandbox")) + "\n[Install]\nWantedBy=multi-user.target\n");
      expect((await exposure(bare)).score).to.be.above(8);
    } finally {
      rmSync(temp, { recursive: true, force: true });
    }
  });
});
