// An execserver SIGKILLed in the middle of a fork: the job exists but its process group
// never reached the reaper. The reaper still finds it by the working directory announced
// before the fork (the soak caught a job that outlived its execserver this way).
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { waitForOutput } from "../../../harness/child-output.js";
import { nodeScript } from "../../../harness/node-children.js";
import { isAlive, isGone } from "../../support/process-liveness.js";

const childScript = fileURLToPath(new URL("./fork-window-child.ts", import.meta.url));

async function orphanedJob(dir: string, ...flags: string[]): Promise<number> {
  const child = spawn(process.execPath, [...nodeScript(childScript), dir, ...flags], { stdio: ["ignore", "pipe", "inherit"] });
  const [, pid] = await waitForOutput(child, /job (\d+)/, { timeoutMs: 20_000 });
  await new Promise((resolve) => child.once("exit", resolve));
  return Number(pid);
}

describe("runner: an execserver killed between fork and watch", function () {
  this.timeout(30_000);
  let dir: string;
  const leftovers: number[] = [];

  beforeEach(() => {
    dir = mkdtempSync(join(tmpdir(), "slotbroker-fork-window-"));
  });
  afterEach(() => {
    for (const pid of leftovers.splice(0)) {
      try {
        process.kill(-pid, "SIGKILL");
      } catch {
        // already gone
      }
    }
    rmSync(dir, { recursive: true, force: true });
  });

  it("still kills the job, found by the working directory announced before the fork", async () => {
    const pid = await orphanedJob(dir);
    leftovers.push(pid);
    assert.equal(await isGone(pid), true, `job ${pid} outlived the process that forked it`);
  });

  it("still kills a job forked in a job directory of the execserver's own, which the reaper scans without an announcement", async () => {
    const pid = await orphanedJob(dir, "--job-dir");
    leftovers.push(pid);
    assert.equal(await isGone(pid), true, `job ${pid} outlived the process that forked it`);
  });

  it("(control) a job forked without the announcement outlives it: the window is real", async () => {
    const pid = await orphanedJob(dir, "--unwatched");
    leftovers.push(pid);
    await new Promise((resolve) => setTimeout(resolve, 500));
    assert.equal(await isAlive(pid), true);
  });
});
