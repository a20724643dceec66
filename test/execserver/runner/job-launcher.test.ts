import { expect } from "chai";
import { existsSync } from "node:fs";
import { mkdir, mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { ErrorKind, type Receipt } from "../../../gen/slotbroker/v1/broker_pb.js";
import { JobLauncher, type JobLauncherOptions } from "../../../src/execserver/runner/job-launcher.js";
import { createRunJob, jobDirsRemoved, type RunJob, type RunRequest } from "../../../src/execserver/runner/index.js";
import { jobDirsUnder } from "../../../harness/job-dirs.js";
import { builtNativeLauncher } from "../../support/native-launcher.js";
import { isGone } from "../../support/process-liveness.js";

function runWith(runJob: RunJob, request: Partial<RunRequest> & Pick<RunRequest, "command">): Promise<Receipt> {
  return runJob({ args: [], env: {}, timeoutMs: 30_000, signal: new AbortController().signal, ...request });
}

/** Runs a job that prints its parent's pid and its background child's pid, then sleeps. */
async function startSleeper(runJob: RunJob): Promise<{ receipt: Promise<Receipt>; pid: number }> {
  let pid: number | undefined;
  const receipt = runWith(runJob, { command: ["sh", "-c", "sleep 30 & wait"], onSpawn: (p) => (pid = p) });
  for (let i = 0; i < 200 && pid === undefined; i++) await new Promise((resolve) => setTimeout(resolve, 10));
  expect(pid, "the job never started").to.be.a("number");
  return { receipt, pid: pid! };
}

// Each case runs against the native launcher (native/job-launcher.c) and the Node script.
for (const kind of ["native", "node"] as const)
describe(`runner: the job launcher (${kind})`, function () {
  this.timeout(20_000);
  before(function () {
    if (kind === "native" && !builtNativeLauncher()) this.skip(); // no C compiler here
  });
  /** Options for a launcher of this kind. */
  const options = (more: JobLauncherOptions = {}): JobLauncherOptions => ({ native: kind === "native" ? builtNativeLauncher() : false, ...more });

  it("forks the job from the launcher, in a process group of its own", async () => {
    const launcher = new JobLauncher(options());
    const runJob = createRunJob({ launcher });
    const receipt = await runWith(runJob, { command: ["sh", "-c", "echo $PPID; ps -o pgid= -p $$"] });
    expect(receipt.error).to.equal(ErrorKind.UNSPECIFIED, receipt.errorMessage);
    const [ppid, pgid] = Buffer.from(receipt.stdoutPrefix).toString().trim().split(/\s+/).map(Number);
    expect(ppid).to.equal(launcher.pid);
    expect(pgid).to.not.equal(process.pid);
    expect(pgid).to.not.equal(launcher.pid);
  });

  it("kills a running job's group when the launcher dies, fails it as KILLED, and starts a new launcher for the next job", async () => {
    const launcher = new JobLauncher(options());
    const runJob = createRunJob({ launcher });
    const { receipt, pid } = await startSleeper(runJob);
    const first = launcher.pid!;
    process.kill(first, "SIGKILL");
    const r = await receipt;
    expect(r.error).to.equal(ErrorKind.KILLED);
    expect(r.errorMessage).to.match(/job launcher \(pid \d+\) died/);
    expect(await isGone(pid)).to.equal(true);

    const next = await runWith(runJob, { command: ["sh", "-c", "echo $PPID"] });
    expect(next.error).to.equal(ErrorKind.UNSPECIFIED, next.errorMessage);
    expect(Number(Buffer.from(next.stdoutPrefix).toString())).to.equal(launcher.pid);
    expect(launcher.pid).to.not.equal(first);
  });

  it("fails a job clearly when the launcher dies at once, then spawns directly for a while", async () => {
    const launcher = new JobLauncher(
      // A program that exits at once: a node flag it rejects, a native "launcher" that is /bin/false.
      options(kind === "native" ? { native: "/bin/false", retryAfterMs: 60_000 } : { nodeFlags: ["--no-such-node-flag"], retryAfterMs: 60_000 }),
    );
    const runJob = createRunJob({ launcher });
    const first = await runWith(runJob, { command: ["true"] });
    expect(first.error).to.equal(ErrorKind.SPAWN_FAILED);
    expect(first.errorMessage).to.match(/job launcher \(pid \d+\) died before the job started/);
    const next = await runWith(runJob, { command: ["sh", "-c", "echo $PPID"] });
    expect(next.error).to.equal(ErrorKind.UNSPECIFIED, next.errorMessage);
    expect(Number(Buffer.from(next.stdoutPrefix).toString())).to.equal(process.pid);
  });

  it("replaces a launcher that does not answer and fails the job instead of hanging", async () => {
    const launcher = new JobLauncher(
      // A program that never answers: sh reading commands from the stdin nobody writes.
      options(kind === "native" ? { native: "/bin/sh", launchTimeoutMs: 300 } : { script: "setInterval(() => {}, 1000)", launchTimeoutMs: 300 }),
    );
    const runJob = createRunJob({ launcher });
    const started = performance.now();
    const stuck = launcher.pid;
    const r = await runWith(runJob, { command: ["true"] });
    expect(r.error).to.equal(ErrorKind.SPAWN_FAILED);
    expect(performance.now() - started).to.be.below(5000);
    expect(stuck).to.equal(undefined); // started lazily, with the first job
  });

  describe("job directories", () => {
    let root: string;
    beforeEach(async () => (root = await mkdtemp(join(tmpdir(), "job-launcher-"))));
    afterEach(() => rm(root, { recursive: true, force: true }));

    /** The launcher's removeDir, recording what each call answered, in the order of the calls. */
    function recordRemovals(launcher: JobLauncher): (boolean | undefined)[] {
      const answers: (boolean | undefined)[] = [];
      const removeDir = launcher.removeDir.bind(launcher);
      launcher.removeDir = async (path) => {
        const call = answers.push(undefined) - 1;
        const removed = await removeDir(path);
        answers[call] = removed;
        return removed;
      };
      return answers;
    }

    it("has the launcher remove finished jobs' directories, alone or with the next spawn, and removes one left non-empty itself", async () => {
      const launcher = new JobLauncher(options());
      const answers = recordRemovals(launcher);
      const runJob = createRunJob({ launcher });
      // Back to back: the first job's directory rides along with the second's spawn.
      expect((await runWith(runJob, { command: ["true"], tempRoot: root })).exitCode).to.equal(0);
      expect((await runWith(runJob, { command: ["sh", "-c", "mkdir -p a/b; touch a/b/c"], tempRoot: root })).exitCode).to.equal(0);
      await jobDirsRemoved();
      expect(answers).to.deep.equal([true, false]);
      expect(jobDirsUnder(root)).to.deep.equal([]);
      // Alone, after the delay: no job follows.
      expect((await runWith(runJob, { command: ["true"], tempRoot: root })).exitCode).to.equal(0);
      await jobDirsRemoved();
      expect(answers).to.deep.equal([true, false, true]);
      expect(jobDirsUnder(root)).to.deep.equal([]);
    });

    it("has a removal that went with a long job's spawn confirmed without waiting for that job", async () => {
      const launcher = new JobLauncher(options());
      const answers = recordRemovals(launcher);
      const runJob = createRunJob({ launcher });
      expect((await runWith(runJob, { command: ["true"], tempRoot: root })).exitCode).to.equal(0);
      const long = runWith(runJob, { command: ["sleep", "5"], tempRoot: root });
      const started = performance.now();
      await jobDirsRemoved();
      expect(performance.now() - started).to.be.below(3000);
      expect(answers).to.deep.equal([true]);
      process.kill(launcher.pid!, "SIGKILL");
      await long;
    });

    it("removes the directories itself that a launcher killed meanwhile had not removed", async () => {
      const launcher = new JobLauncher(options());
      const answers = recordRemovals(launcher);
      const runJob = createRunJob({ launcher });
      const receipts = await Promise.all([0, 1].map(() => runWith(runJob, { command: ["true"], tempRoot: root })));
      expect(receipts.map((r) => r.exitCode)).to.deep.equal([0, 0]);
      // Both directories wait for the launcher (REMOVE_DELAY_MS): it dies first.
      process.kill(launcher.pid!, "SIGKILL");
      await jobDirsRemoved();
      expect(answers).to.deep.equal([false, false]);
      expect(jobDirsUnder(root)).to.deep.equal([]);
      // Queued, never sent: the directories of jobs of a launcher that is gone.
      const dirs = [join(root, "x"), join(root, "y")];
      for (const dir of dirs) await mkdir(dir);
      expect(await Promise.all(dirs.map((dir) => launcher.removeDir(dir)))).to.deep.equal([false, false]);
      for (const dir of dirs) expect(existsSync(dir)).to.equal(true);
    });
  });

  it("reports a missing executable through the launcher as SPAWN_FAILED naming it", async () => {
    const runJob = createRunJob({ launcher: new JobLauncher(options()) });
    const r = await runWith(runJob, { command: ["no-such-command-for-slotbroker"] });
    expect(r.error).to.equal(ErrorKind.SPAWN_FAILED);
    expect(r.errorMessage).to.equal('cannot start "no-such-command-for-slotbroker": ENOENT: no such file or directory (looked up on the job\'s PATH)');
  });
});

describe("runner: the job launcher's messages are untrusted", function () {
  this.timeout(20_000);
  // A launcher that starts the job, passes its stdout (or, asked to read it, says what it
  // read), and says everything else wrong.
  const script = String.raw`
    const { spawn } = require("node:child_process");
    process.on("message", (m) => {
      if (!m || m.t !== "spawn") return;
      for (const bad of ["text", [1, 2], 5, { t: "exit" }, { t: "exit", id: "1" }, { t: "stderr", id: m.id, err: {} }, { t: "fd", id: m.id, n: 9, pid: 1 },
        { t: "rm", rmn: "x", left: [1, null, {}] }, { t: "rm", rmn: 1e300, left: "nope" }, { t: "failed", id: 12345 }, { t: "started", id: m.id, pid: "1" }])
        process.send(bad);
      const child = spawn("sh", ["-c", "echo out"], { stdio: ["ignore", "pipe", "ignore"], detached: true });
      child.stdout._handle.readStop(); // the output is the execserver's to read
      if (m.stdout === false) process.send({ t: "started", id: m.id, pid: child.pid, watched: "yes" });
      else process.send({ t: "fd", id: m.id, n: 1, pid: child.pid }, child.stdout);
      const out = m.stdout === false ? { out: "6f75740a", outn: -3 } : { out: "6f75740a", outn: 4 };
      child.on("exit", () => process.send({ t: "exit", id: m.id, code: "0", signal: 7, err: "zz-not-hex", open: "yes", rmn: -1, ...out }));
    });
    process.stdin.on("end", () => process.exit(0));
    process.stdin.resume();
  `;

  it("survives malformed messages and ends the job with what it can tell", async () => {
    const launcher = new JobLauncher({ native: false, script });
    const runJob = createRunJob({ launcher });
    const receipt = await runWith(runJob, { command: ["ignored"] });
    expect(Buffer.from(receipt.stdoutPrefix).toString()).to.equal("out\n");
    expect(receipt.stdoutBytes).to.equal(4n);
    expect(receipt.stderrLine).to.equal("");
    expect(receipt.exitCode).to.equal(undefined);
  });
  // A launcher that passes stdout on with the bytes it "read" of it (abc), after spills
  // for nobody and before one too many; or ("bad" jobs) with bytes that cannot be right.
  const spiller = String.raw`
    const { spawn } = require("node:child_process");
    process.on("message", (m) => {
      if (!m || m.t !== "spawn") return;
      const child = spawn("sh", ["-c", "printf def"], { stdio: ["ignore", "pipe", "ignore"], detached: true });
      child.stdout._handle.readStop();
      process.send({ t: "started", id: m.id, pid: child.pid });
      for (const bad of [{ t: "spill" }, { t: "spill", id: 999, out: "61" }, { t: "spill", id: m.id + 1, out: "61" }, { t: "spill", id: [m.id] }])
        process.send(bad);
      const out = m.file === "bad" ? ["zz", "61".repeat(4002), 5, ""][m.args.length] : "616263";
      process.send({ t: "spill", id: m.id, out }, child.stdout);
      process.send({ t: "spill", id: m.id, out: "61" });
      child.on("exit", (code) => process.send({ t: "exit", id: m.id, code, signal: null, out: "7a7a", outn: 2 }));
    });
    process.stdin.on("end", () => process.exit(0));
    process.stdin.resume();
  `;

  it("takes a spilled stdout's first bytes before the rest, and fails the job when a spill cannot be right", async () => {
    const launcher = new JobLauncher({ native: false, script: spiller, nativeProtocol: true });
    const runJob = createRunJob({ launcher });
    const receipt = await runWith(runJob, { command: ["good"], stdoutUrl: "http://127.0.0.1:9/never-opened" });
    expect(receipt.error).to.equal(ErrorKind.UNSPECIFIED, receipt.errorMessage);
    expect(Buffer.from(receipt.stdoutPrefix).toString()).to.equal("abcdef");
    expect(receipt.stdoutBytes).to.equal(6n);
    for (const args of [[], ["1"], ["1", "2"], ["1", "2", "3"]]) {
      const bad = await runWith(runJob, { command: ["bad"], args, stdoutUrl: "http://127.0.0.1:9/never-opened" });
      expect(bad.error, args.join()).to.equal(ErrorKind.PIPE_FAILED);
      expect(bad.errorMessage).to.equal("the job launcher could not pass the job's stdout on");
    }
  });
});
