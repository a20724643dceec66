// Child of fork-window.test.ts: stands for an execserver killed between forking a job and
// registering the job's process group. It announces the fork in DIR (watchForkIn unless
// "--unwatched"; with "--job-dir" in a job directory the runner's makeJobDir makes in DIR,
// as the runner does), spawns `sleep` there in its own group the way the runner does, prints
// the pid and SIGKILLs itself without ever creating the job's GroupWatchdog.
import { spawn } from "node:child_process";
import { watchForkIn } from "../../../src/execserver/runner/group-watchdog.js";
import { makeJobDir } from "../../../src/execserver/runner/job-dir.js";

const [root = "", mode = ""] = process.argv.slice(2);
const onError = (err: Error): void => void process.stderr.write(`${String(err)}\n`);
const dir = mode === "--job-dir" ? makeJobDir(root, onError) : root;
if (mode !== "--unwatched") watchForkIn(dir, onError);
const child = spawn("sleep", ["30"], { cwd: dir, detached: true, stdio: "ignore" });
child.once("spawn", () => {
  process.stdout.write(`job ${child.pid}\n`, () => process.kill(process.pid, "SIGKILL"));
});
