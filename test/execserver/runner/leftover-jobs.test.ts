// The sweep an execserver runs as it starts, on a hand-made temp directory with real
// processes: it kills and removes only what an execserver that is gone left.
import { spawn, type ChildProcess } from "node:child_process";
import { existsSync, mkdirSync, mkdtempSync, rmSync, symlinkSync, utimesSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { expect } from "chai";
import { silentLogger } from "../../../src/shared/log.js";
import { sweepLeftoverJobs } from "../../../src/execserver/runner/index.js";
import { thisProcess } from "../../../src/execserver/runner/job-dir-owner.js";
import { livingMembers } from "../../support/process-group.js";

describe("runner: sweeping what dead execservers left", function () {
  this.timeout(30_000);
  let root: string;
  const started: ChildProcess[] = [];

  beforeEach(() => {
    root = mkdtempSync(join(tmpdir(), "slotbroker-sweep-"));
  });
  afterEach(() => {
    for (const c of started.splice(0)) {
      try {
        process.kill(-c.pid!, "SIGKILL");
      } catch {
        // gone
      }
    }
    rmSync(root, { recursive: true, force: true });
  });

  /** An execserver's directory with `owner` (undefined: no owner file) and one job directory. */
  function ownerDir(name: string, owner: object | undefined): string {
    const dir = join(root, `slotbroker-jobs-${name}`);
    mkdirSync(join(dir, "slotbroker-job-x"), { recursive: true });
    if (owner) writeFileSync(join(dir, "owner.json"), JSON.stringify(owner));
    return dir;
  }

  /** A job (its own session, a background child) working in `dir`'s job directory. */
  async function jobIn(dir: string): Promise<number> {
    const child = spawn("sh", ["-c", "sleep 60 & sleep 60"], { cwd: join(dir, "slotbroker-job-x"), detached: true, stdio: "ignore" });
    started.push(child);
    await new Promise((resolve) => child.once("spawn", resolve));
    while ((await livingMembers(child.pid!)).length < 2) await new Promise((r) => setTimeout(r, 10));
    return child.pid!;
  }

  it("kills the jobs of a dead owner's directory with their groups and removes it; leaves a live owner's alone", async () => {
    const me = thisProcess();
    const live = ownerDir("live", me);
    // The parent process runs, but started at another time: a pid reused after the owner died.
    const dead = ownerDir("dead", { ...me, pid: process.ppid, startTime: "1" });
    const liveJob = await jobIn(live);
    const deadJob = await jobIn(dead);
    const liveMembers = await livingMembers(liveJob);

    const result = await sweepLeftoverJobs(root, silentLogger);
    expect(result.dirs).to.have.length(1);
    expect(result.survivors).to.deep.equal([]);
    expect(await livingMembers(deadJob), "the dead owner's job and its child").to.deep.equal([]);
    expect(existsSync(dead)).to.equal(false);
    expect(await livingMembers(liveJob)).to.have.members(liveMembers);
    expect(existsSync(join(live, "slotbroker-job-x"))).to.equal(true);
  });

  it("leaves a directory in the making (no owner file yet), another pid namespace's and a symlink alone; removes one without an owner file that is old", async () => {
    const young = ownerDir("young", undefined);
    const old = ownerDir("old", undefined);
    utimesSync(old, new Date(Date.now() - 120_000), new Date(Date.now() - 120_000));
    const foreign = ownerDir("foreign", { ...thisProcess(), pid: 1, pidNamespace: "pid:[1]" });
    const target = mkdtempSync(join(tmpdir(), "slotbroker-sweep-target-"));
    try {
      mkdirSync(join(target, "slotbroker-job-x"));
      symlinkSync(target, join(root, "slotbroker-jobs-link"));
      const foreignJob = await jobIn(foreign);
      const foreignMembers = await livingMembers(foreignJob);

      const result = await sweepLeftoverJobs(root, silentLogger);
      expect(result.dirs.map((d) => d.split("/").pop())).to.deep.equal(["slotbroker-jobs-old"]);
      expect(existsSync(old)).to.equal(false);
      expect(existsSync(young)).to.equal(true);
      expect(existsSync(join(target, "slotbroker-job-x"))).to.equal(true);
      expect(await livingMembers(foreignJob)).to.have.members(foreignMembers);
    } finally {
      rmSync(target, { recursive: true, force: true });
    }
  });
});
