import { expect } from "chai";
import { createHash, randomBytes } from "node:crypto";
import { chmod, mkdtemp, readdir, readFile, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { basename, dirname, join } from "node:path";
import { ErrorKind, type Receipt } from "../../../gen/slotbroker/v1/broker_pb.js";
import { createRunJob, JobLauncher, jobDirsRemoved, runJob, type RunJob, type RunRequest } from "../../../src/execserver/runner/index.js";
import { freePort } from "../../../src/shared/free-port.js";
import { startPipeServer } from "./pipe-server.js";
import { jobDirsUnder } from "../../../harness/job-dirs.js";
import { builtNativeLauncher } from "../../support/native-launcher.js";
import { isGone } from "../../support/process-liveness.js";

const sha256 = (data: Buffer): string => createHash("sha256").update(data).digest("hex");

// Every case runs three times: jobs started by the native job launcher, by the Node
// launcher script (`jobLauncher: true` without a compiled launcher), and forked by this
// process.
let runner: RunJob = runJob;

function run(request: Partial<RunRequest> & Pick<RunRequest, "command">): Promise<Receipt> {
  return runner({ args: [], env: {}, timeoutMs: 30_000, signal: new AbortController().signal, ...request });
}

/** A loopback port with nothing listening on it. */
// A port nobody listens on: picked outside the kernel's ephemeral range, so no port-0 bind
// elsewhere is handed it between the pick and the job's connect.
const closedPort = freePort;

for (const [mode, modeRunner] of [
  ["through the native job launcher", () => createRunJob({ launcher: new JobLauncher({ native: builtNativeLauncher() ?? "not-built" }) })],
  ["through the Node job launcher", () => createRunJob({ launcher: new JobLauncher({ native: false }) })],
  ["spawned directly", () => runJob],
] as const)
describe(`runner: runJob, ${mode}`, () => {
  before(function () {
    if (mode === "through the native job launcher" && !builtNativeLauncher()) this.skip(); // no C compiler here
    runner = modeRunner();
  });
  describe("streams", () => {
    it("round-trips a 16 MiB body from the stdin URL through cat to the stdout URL", async () => {
      const body = randomBytes(16 * 1024 * 1024);
      const pipes = await startPipeServer({ stdinBody: body });
      try {
        const receipt = await run({ command: ["cat"], stdinUrl: pipes.stdinUrl, stdoutUrl: pipes.stdoutUrl });
        expect(receipt.error).to.equal(ErrorKind.UNSPECIFIED, receipt.errorMessage);
        expect(receipt.exitCode).to.equal(0);
        expect(receipt.stdoutStreamed).to.equal(true);
        expect(receipt.stdoutBytes).to.equal(BigInt(body.length));
        expect(Buffer.from(receipt.stdoutPrefix)).to.deep.equal(body.subarray(0, 4000));
        expect(pipes.uploads).to.have.length(1);
        const upload = await pipes.uploads[0]!;
        expect(upload.outcome).to.equal("complete");
        expect(upload.bytes).to.equal(body.length);
        expect(upload.sha256).to.equal(sha256(body));
      } finally {
        await pipes.close();
      }
    });

    it("sends nothing to the stdout URL when a command fails with small output", async () => {
      const pipes = await startPipeServer();
      try {
        const script = 'echo "partial result"; echo "warning: something" >&2; echo "fatal: the decisive error" >&2; echo >&2; exit 3';
        const receipt = await run({ command: ["sh", "-c", script], stdoutUrl: pipes.stdoutUrl });
        expect(pipes.requests).to.deep.equal([]);
        expect(receipt.exitCode).to.equal(3);
        expect(receipt.error).to.equal(ErrorKind.UNSPECIFIED);
        expect(receipt.stderrLine).to.equal("fatal: the decisive error");
        expect(Buffer.from(receipt.stdoutPrefix).toString()).to.equal("partial result\n");
        expect(receipt.stdoutBytes).to.equal(15n);
        expect(receipt.stdoutStreamed).to.equal(false);
      } finally {
        await pipes.close();
      }
    });

    it("keeps exactly 4000 bytes of successful output in the receipt and streams 4001", async () => {
      const pipes = await startPipeServer();
      try {
        const held = await run({ command: ["head", "-c", "4000", "/dev/zero"], stdoutUrl: pipes.stdoutUrl });
        expect(held.exitCode).to.equal(0);
        expect(held.stdoutStreamed).to.equal(false);
        expect(held.stdoutPrefix.length).to.equal(4000);
        expect(pipes.requests).to.deep.equal([]);

        const streamed = await run({ command: ["head", "-c", "4001", "/dev/zero"], stdoutUrl: pipes.stdoutUrl });
        expect(streamed.exitCode).to.equal(0);
        expect(streamed.stdoutStreamed).to.equal(true);
        expect(streamed.stdoutBytes).to.equal(4001n);
        expect(pipes.requests).to.deep.equal(["PUT /out"]);
        const upload = await pipes.uploads[0]!;
        expect(upload).to.include({ outcome: "complete", bytes: 4001 });
      } finally {
        await pipes.close();
      }
    });

    it("streams stdout byte-exact around the receipt's 4000 bytes, binary and in pieces, and keeps smaller output in the receipt", async () => {
      const pipes = await startPipeServer();
      const dir = await mkdtemp(join(tmpdir(), "run-job-bytes-"));
      try {
        const cases: [string, Buffer][] = [];
        for (const size of [1, 3999, 4000, 4001, 4002, 8001, 65537, 1 << 20]) {
          const body = randomBytes(size);
          body[0] = 0; // NULs included
          body[size - 1] = 0;
          const file = join(dir, `b${size}`);
          await writeFile(file, body);
          cases.push([`cat ${file}`, body]);
        }
        // Pieces: the launcher's reads end inside and right at the limit, and one byte at a time.
        const piece = (n: number, c: string): string => `head -c ${n} /dev/zero | tr '\\0' '${c}'`;
        cases.push([`${piece(3000, "a")}; sleep 0.05; ${piece(3000, "b")}`, Buffer.concat([Buffer.alloc(3000, "a"), Buffer.alloc(3000, "b")])]);
        cases.push([`${piece(4000, "a")}; sleep 0.05; printf b; sleep 0.05; ${piece(5000, "c")}`, Buffer.concat([Buffer.alloc(4000, "a"), Buffer.from("b"), Buffer.alloc(5000, "c")])]);
        cases.push([`${piece(4000, "a")}; sleep 0.05; printf b`, Buffer.concat([Buffer.alloc(4000, "a"), Buffer.from("b")])]);
        const ones = randomBytes(4100);
        await writeFile(join(dir, "ones"), ones);
        cases.push([`dd if=${join(dir, "ones")} bs=1 2>/dev/null`, ones]);
        for (const [script, body] of cases) {
          const uploads = pipes.uploads.length;
          const receipt = await run({ command: ["sh", "-c", script], stdoutUrl: pipes.stdoutUrl });
          const what = `${script} (${body.length} bytes)`;
          expect(receipt.error, what).to.equal(ErrorKind.UNSPECIFIED, receipt.errorMessage);
          expect(receipt.exitCode, what).to.equal(0);
          expect(receipt.stdoutBytes, what).to.equal(BigInt(body.length));
          expect(Buffer.from(receipt.stdoutPrefix).equals(body.subarray(0, 4000)), what).to.equal(true);
          expect(receipt.stdoutStreamed, what).to.equal(body.length > 4000);
          expect(pipes.uploads.length - uploads, what).to.equal(body.length > 4000 ? 1 : 0);
          if (body.length <= 4000) continue;
          const upload = await pipes.uploads[uploads]!;
          expect(upload, what).to.include({ outcome: "complete", bytes: body.length, sha256: sha256(body) });
        }
      } finally {
        await pipes.close();
        await rm(dir, { recursive: true, force: true });
      }
    });

    it("streams what a background child writes past 4000 bytes after the job exited", async () => {
      const pipes = await startPipeServer();
      try {
        const receipt = await run({ command: ["sh", "-c", "printf start; (sleep 0.2; head -c 100000 /dev/zero) &"], stdoutUrl: pipes.stdoutUrl });
        expect(receipt.exitCode).to.equal(0);
        expect(receipt.stdoutBytes).to.equal(100005n);
        expect(receipt.stdoutStreamed).to.equal(true);
        const upload = await pipes.uploads[0]!;
        expect(upload).to.include({ outcome: "complete", bytes: 100005, sha256: sha256(Buffer.concat([Buffer.from("start"), Buffer.alloc(100000)])) });
      } finally {
        await pipes.close();
      }
    });

    it("aborts the upload of a job killed mid-output, and of one timed out after it", async () => {
      const pipes = await startPipeServer();
      try {
        const endless = await run({ command: ["sh", "-c", "yes"], stdoutUrl: pipes.stdoutUrl, timeoutMs: 300, killGraceMs: 100 });
        expect(endless.error).to.equal(ErrorKind.TIMEOUT);
        expect(Buffer.from(endless.stdoutPrefix).toString()).to.equal("y\n".repeat(2000));
        expect(endless.stdoutBytes > 4000n).to.equal(true);
        expect(endless.stdoutStreamed).to.equal(true);
        expect(await pipes.uploads[0]!).to.include({ outcome: "aborted" });
        const quiet = await run({ command: ["sh", "-c", "head -c 5000 /dev/zero; sleep 30"], stdoutUrl: pipes.stdoutUrl, timeoutMs: 300, killGraceMs: 100 });
        expect(quiet.error).to.equal(ErrorKind.TIMEOUT);
        expect(quiet.stdoutBytes).to.equal(5000n);
        expect(await pipes.uploads[1]!).to.include({ outcome: "aborted", bytes: 5000 });
      } finally {
        await pipes.close();
      }
    });

    it("writes inline stdin byte-exact, to a slow reader too, and does not blame a job that reads none of it", async () => {
      for (const size of [1, 4096, 65536, 1 << 20]) {
        const body = randomBytes(size);
        body[0] = 0;
        const receipt = await run({ command: ["sh", "-c", "sleep 0.05; sha256sum"], stdinInline: body });
        expect(receipt.error, `${size}`).to.equal(ErrorKind.UNSPECIFIED, receipt.errorMessage);
        expect(Buffer.from(receipt.stdoutPrefix).toString().split(" ")[0], `${size}`).to.equal(sha256(body));
      }
      const unread = await run({ command: ["true"], stdinInline: randomBytes(1 << 20) });
      expect(unread.error).to.equal(ErrorKind.UNSPECIFIED, unread.errorMessage);
      expect(unread.exitCode).to.equal(0);
      const partly = await run({ command: ["head", "-c", "10"], stdinInline: Buffer.alloc(1 << 20, "x") });
      expect(partly.error).to.equal(ErrorKind.UNSPECIFIED, partly.errorMessage);
      expect(Buffer.from(partly.stdoutPrefix).toString()).to.equal("x".repeat(10));
    });

    it("aborts the upload when the command fails after passing 4000 bytes", async () => {
      // The command fails only once the upload has carried more than 4000 bytes (its stdin
      // ends then): otherwise, on a busy machine, it may fail before the upload's request is sent.
      let streamed!: () => void;
      const pipes = await startPipeServer({ stdinHold: new Promise((resolve) => (streamed = resolve)) });
      try {
        const script = "head -c 100000 /dev/zero; cat > /dev/null; echo 'boom: it broke' >&2; exit 2";
        const running = run({ command: ["sh", "-c", script], stdinUrl: pipes.stdinUrl, stdoutUrl: pipes.stdoutUrl });
        await pipes.uploadReached(4001);
        streamed();
        const receipt = await running;
        expect(receipt.exitCode).to.equal(2);
        expect(receipt.stdoutStreamed).to.equal(true);
        expect(receipt.stdoutBytes).to.equal(100000n);
        expect(receipt.stderrLine).to.equal("boom: it broke");
        expect(receipt.errorMessage).to.contain("stdout upload aborted");
        expect(pipes.uploads).to.have.length(1);
        const upload = await pipes.uploads[0]!;
        expect(upload.outcome).to.equal("aborted");
        expect(upload.bytes).to.be.above(4000);
      } finally {
        await pipes.close();
      }
    });

    it("reports PIPE_FAILED when the stdout URL refuses the upload", async () => {
      const pipes = await startPipeServer({ stdoutStatus: 500 });
      try {
        const receipt = await run({ command: ["head", "-c", "1000000", "/dev/zero"], stdoutUrl: pipes.stdoutUrl });
        expect(receipt.error).to.equal(ErrorKind.PIPE_FAILED);
        // The refusal arrives either as the answer itself or, when the server closes the
        // connection before the runner reads it, as a write error on the upload.
        expect(receipt.errorMessage).to.match(/HTTP 500|EPIPE|ECONNRESET/);
        expect(receipt.stdoutStreamed).to.equal(true);
      } finally {
        await pipes.close();
      }
    });

    it("reports PIPE_FAILED when nothing listens at the stdout URL", async () => {
      const port = await closedPort();
      const receipt = await run({ command: ["head", "-c", "100000", "/dev/zero"], stdoutUrl: `http://127.0.0.1:${port}/out` });
      expect(receipt.error).to.equal(ErrorKind.PIPE_FAILED);
      expect(receipt.errorMessage).to.contain("ECONNREFUSED");
    });

    it("discards output past the prefix when there is no stdout URL, without an error", async () => {
      const receipt = await run({ command: ["head", "-c", "1000000", "/dev/zero"] });
      expect(receipt.exitCode).to.equal(0);
      expect(receipt.error).to.equal(ErrorKind.UNSPECIFIED);
      expect(receipt.stdoutStreamed).to.equal(false);
      expect(receipt.stdoutBytes).to.equal(1000000n);
      expect(receipt.stdoutPrefix.length).to.equal(4000);
    });

    it("reports PIPE_FAILED when the stdin URL answers 404, and sends no stdout", async () => {
      const pipes = await startPipeServer({ stdinStatus: 404 });
      try {
        const receipt = await run({ command: ["cat"], stdinUrl: pipes.stdinUrl, stdoutUrl: pipes.stdoutUrl });
        expect(receipt.error).to.equal(ErrorKind.PIPE_FAILED);
        expect(receipt.errorMessage).to.contain("HTTP 404");
        expect(pipes.requests).to.deep.equal(["GET /in"]);
      } finally {
        await pipes.close();
      }
    });

    it("reports PIPE_FAILED when the stdin body breaks off, never ending cat's input cleanly", async () => {
      const body = randomBytes(1024 * 1024);
      const pipes = await startPipeServer({ stdinBody: body, stdinBreakAfter: 100_000 });
      try {
        const receipt = await run({ command: ["cat"], stdinUrl: pipes.stdinUrl, stdoutUrl: pipes.stdoutUrl });
        expect(receipt.error).to.equal(ErrorKind.PIPE_FAILED);
        expect(receipt.errorMessage).to.contain("broke off");
        for (const upload of await Promise.all(pipes.uploads)) expect(upload.outcome).to.equal("aborted");
      } finally {
        await pipes.close();
      }
    });

    it("reports PIPE_FAILED when nothing listens at the stdin URL", async () => {
      const port = await closedPort();
      const receipt = await run({ command: ["cat"], stdinUrl: `http://127.0.0.1:${port}/in` });
      expect(receipt.error).to.equal(ErrorKind.PIPE_FAILED);
      expect(receipt.errorMessage).to.contain("ECONNREFUSED");
    });

    it("does not blame the job when the command exits without reading all of stdin", async () => {
      const body = randomBytes(8 * 1024 * 1024);
      const pipes = await startPipeServer({ stdinBody: body });
      try {
        const receipt = await run({ command: ["head", "-c", "10"], stdinUrl: pipes.stdinUrl });
        expect(receipt.error).to.equal(ErrorKind.UNSPECIFIED, receipt.errorMessage);
        expect(receipt.exitCode).to.equal(0);
        expect(Buffer.from(receipt.stdoutPrefix)).to.deep.equal(body.subarray(0, 10));
      } finally {
        await pipes.close();
      }
    });

    it("gives a command without a stdin URL an empty, closed stdin", async () => {
      const receipt = await run({ command: ["cat"] });
      expect(receipt.exitCode).to.equal(0);
      expect(receipt.stdoutBytes).to.equal(0n);
    });

    it("gives a job without stdin /dev/null, however it is started (Linux)", async function () {
      if (process.platform !== "linux") this.skip();
      const receipt = await run({ command: ["readlink", "/proc/self/fd/0"] });
      expect(receipt.exitCode).to.equal(0);
      expect(Buffer.from(receipt.stdoutPrefix).toString().trim()).to.equal("/dev/null");
    });

    it("keeps only the last non-empty stderr line of a long stderr", async () => {
      const script = "i=0; while [ $i -lt 20000 ]; do echo \"noise line $i\" >&2; i=$((i+1)); done; echo 'the last word' >&2; echo '' >&2";
      const receipt = await run({ command: ["sh", "-c", script] });
      expect(receipt.exitCode).to.equal(0);
      expect(receipt.stderrLine).to.equal("the last word");
    });

    it("keeps the first 1000 bytes of a longer stderr line, whole characters only, and skips blank lines after it", async () => {
      const script = "{ printf ab; head -c 1500 /dev/zero | tr '\\0' y; printf '\\n \\n\\n'; } >&2";
      const long = await run({ command: ["sh", "-c", script] });
      expect(long.stderrLine).to.equal(`ab${"y".repeat(998)}`);
      // 'é' is two bytes: the 1000-byte cut splits the 500th, which is dropped.
      const wide = await run({ command: ["sh", "-c", "{ printf x; printf 'é%.0s' $(seq 600); } >&2"] });
      expect(wide.stderrLine).to.equal(`x${"é".repeat(499)}`);
    });

    it("takes the stderr line a background child writes after the job exited, and ends the job once it closes stderr", async () => {
      const receipt = await run({ command: ["sh", "-c", "echo early >&2; (sleep 0.3; echo late >&2) &"] });
      expect(receipt.exitCode).to.equal(0);
      expect(receipt.stderrLine).to.equal("late");
    });

    it("still ends a job whose stderr is held open by a process that left its group, with the line so far", async () => {
      const receipt = await run({ command: ["sh", "-c", "echo 'the line' >&2; setsid sleep 30 >&2 & echo $!"], timeoutMs: 300, killGraceMs: 100 });
      const pid = Number(Buffer.from(receipt.stdoutPrefix).toString().trim());
      try {
        expect(receipt.error).to.equal(ErrorKind.TIMEOUT);
        expect(receipt.exitCode).to.equal(0);
        expect(receipt.stderrLine).to.equal("the line");
      } finally {
        if (pid > 0) process.kill(pid, "SIGKILL");
      }
    });
  });

  describe("processes", () => {
    it("kills the whole process group on timeout", async () => {
      const script = "sleep 100 & echo $!; sleep 100 & echo $!; wait";
      const receipt = await run({ command: ["sh", "-c", script], timeoutMs: 300, killGraceMs: 5000 });
      expect(receipt.error).to.equal(ErrorKind.TIMEOUT);
      expect(receipt.signal).to.equal("SIGTERM");
      expect(receipt.exitCode).to.equal(undefined);
      const pids = Buffer.from(receipt.stdoutPrefix).toString().trim().split("\n").map(Number);
      expect(pids).to.have.length(2);
      for (const pid of pids) expect(await isGone(pid), `sleep ${pid} still running`).to.equal(true);
    });

    it("escalates to SIGKILL when the group ignores SIGTERM", async () => {
      // An ignored signal stays ignored in children, so `sleep` ignores SIGTERM too.
      const receipt = await run({ command: ["sh", "-c", "trap '' TERM; sleep 100 & echo $!; wait"], timeoutMs: 200, killGraceMs: 200 });
      expect(receipt.error).to.equal(ErrorKind.TIMEOUT);
      expect(receipt.signal).to.equal("SIGKILL");
      const pid = Number(Buffer.from(receipt.stdoutPrefix).toString().trim());
      expect(await isGone(pid)).to.equal(true);
    });

    it("kills background processes a successful job leaves behind", async () => {
      const receipt = await run({ command: ["sh", "-c", "sleep 100 >/dev/null 2>&1 & echo $!"] });
      expect(receipt.exitCode).to.equal(0);
      const pid = Number(Buffer.from(receipt.stdoutPrefix).toString().trim());
      expect(await isGone(pid)).to.equal(true);
    });

    it("still ends a job whose stdout is held open by a process that left its group", async () => {
      // setsid puts the sleep in a new session, out of reach of the group kill; it keeps
      // the job's stdout open, so only giving up on the pipes lets the job end.
      const receipt = await run({ command: ["sh", "-c", "setsid sleep 30 & echo $!"], timeoutMs: 300, killGraceMs: 100 });
      const pid = Number(Buffer.from(receipt.stdoutPrefix).toString().trim());
      try {
        expect(receipt.error).to.equal(ErrorKind.TIMEOUT);
        expect(receipt.exitCode).to.equal(0);
      } finally {
        if (pid > 0) process.kill(pid, "SIGKILL");
      }
    });

    it("cancels on abort", async () => {
      const controller = new AbortController();
      const pending = run({ command: ["sh", "-c", "sleep 100 & wait"], signal: controller.signal });
      setTimeout(() => controller.abort(new Error("connection dropped")), 100);
      const receipt = await pending;
      expect(receipt.error).to.equal(ErrorKind.CANCELLED);
      expect(receipt.errorMessage).to.contain("connection dropped");
    });

    it("does not start a job whose signal is already aborted", async () => {
      const controller = new AbortController();
      controller.abort();
      const receipt = await run({ command: ["sh", "-c", "exit 0"], signal: controller.signal });
      expect(receipt.error).to.equal(ErrorKind.CANCELLED);
      expect(receipt.exitCode).to.equal(undefined);
    });

    it("reports KILLED for a signal the runner did not send", async () => {
      const receipt = await run({ command: ["sh", "-c", "kill -9 $$"] });
      expect(receipt.error).to.equal(ErrorKind.KILLED);
      expect(receipt.signal).to.equal("SIGKILL");
      expect(receipt.exitCode).to.equal(undefined);
    });

    it("reports SPAWN_FAILED for a missing executable", async () => {
      const receipt = await run({ command: ["slotbroker-no-such-command-here"], args: ["x"] });
      expect(receipt.error).to.equal(ErrorKind.SPAWN_FAILED);
      expect(receipt.errorMessage).to.contain("ENOENT").and.contain("slotbroker-no-such-command-here");
      expect(receipt.exitCode).to.equal(undefined);
    });

    it("reports SPAWN_FAILED for a file that is not executable", async () => {
      const dir = await mkdtemp(join(tmpdir(), "runner-test-"));
      try {
        const file = join(dir, "not-executable");
        await writeFile(file, "#!/bin/sh\nexit 0\n");
        await chmod(file, 0o644);
        const receipt = await run({ command: [file] });
        expect(receipt.error).to.equal(ErrorKind.SPAWN_FAILED);
        expect(receipt.errorMessage).to.contain("EACCES");
      } finally {
        await rm(dir, { recursive: true, force: true });
      }
    });

    it("shows the process only the given environment plus PATH", async () => {
      process.env.SLOTBROKER_RUNNER_TEST_SECRET = "must-not-leak";
      try {
        const receipt = await run({ command: ["env"], env: { GREETING: "hello world", LANG: "C" } });
        const lines = Buffer.from(receipt.stdoutPrefix).toString().trim().split("\n").sort();
        expect(lines).to.deep.equal(["GREETING=hello world", "LANG=C", `PATH=${process.env.PATH}`]);
      } finally {
        delete process.env.SLOTBROKER_RUNNER_TEST_SECRET;
      }
    });

    it("removes the directories of jobs that ran side by side, also one left non-empty", async () => {
      const root = await mkdtemp(join(tmpdir(), "runner-root-"));
      try {
        const receipts = await Promise.all(
          ["true", "mkdir -p a/b && touch a/b/c", "touch x"].map((script) => run({ command: ["sh", "-c", script], tempRoot: root })),
        );
        expect(receipts.map((r) => r.exitCode)).to.deep.equal([0, 0, 0]);
        await jobDirsRemoved();
        expect(jobDirsUnder(root)).to.deep.equal([]);
      } finally {
        await rm(root, { recursive: true, force: true });
      }
    });

    it("gives every job a fresh, empty, private directory, also after its execserver's directory was removed meanwhile", async () => {
      const root = await mkdtemp(join(tmpdir(), "runner-root-"));
      try {
        const probe = { command: ["sh", "-c", "pwd; stat -c %a .; ls -A | wc -l; touch mine"], tempRoot: root };
        const first = Buffer.from((await run(probe)).stdoutPrefix).toString().trim().split("\n");
        expect(first.slice(1)).to.deep.equal(["700", "0"]);
        // A cleaner of old temp files removes the execserver's own directory between jobs.
        await jobDirsRemoved();
        await rm(dirname(first[0]!), { recursive: true, force: true });
        const receipt = await run(probe);
        expect(receipt.exitCode).to.equal(0);
        const second = Buffer.from(receipt.stdoutPrefix).toString().trim().split("\n");
        expect(second.slice(1)).to.deep.equal(["700", "0"]);
        expect(dirname(second[0]!)).to.not.equal(dirname(first[0]!));
        await jobDirsRemoved();
        expect(jobDirsUnder(root)).to.deep.equal([]);
      } finally {
        await rm(root, { recursive: true, force: true });
      }
    });

    it("passes arguments verbatim, without a shell", async () => {
      const receipt = await run({ command: ["printf", "%s|"], args: ["$HOME", "a b", "*", "; rm -rf /"] });
      expect(Buffer.from(receipt.stdoutPrefix).toString()).to.equal("$HOME|a b|*|; rm -rf /|");
    });

    it("runs in a fresh temp directory under tempRoot and removes it afterwards", async () => {
      const root = await mkdtemp(join(tmpdir(), "runner-root-"));
      try {
        const receipt = await run({ command: ["sh", "-c", "pwd; touch leftover"], tempRoot: root });
        expect(receipt.exitCode).to.equal(0);
        const cwd = Buffer.from(receipt.stdoutPrefix).toString().trim();
        // In this process's own directory there, which says who made it.
        const own = dirname(cwd);
        expect(dirname(own)).to.equal(root);
        expect(basename(own)).to.match(new RegExp(`^slotbroker-jobs-${process.pid}-`));
        expect(basename(cwd)).to.match(/^slotbroker-job-/);
        expect(JSON.parse(await readFile(join(own, "owner.json"), "utf8"))).to.include({ pid: process.pid });
        // Removed after the receipt, off the event loop; jobDirsRemoved() sees it through.
        await jobDirsRemoved();
        expect(await readdir(root)).to.deep.equal([basename(own)]);
        expect(await readdir(own)).to.deep.equal(["owner.json"]);
      } finally {
        await rm(root, { recursive: true, force: true });
      }
    });
  });
});
