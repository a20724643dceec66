import { expect } from "chai";
import { createHash, randomBytes } from "node:crypto";
import { Readable } from "node:stream";
import { durationFromMs } from "@bufbuild/protobuf/wkt";
import { jobSpecLimits } from "../../src/shared/job-limits.js";
import { FakeExecserver } from "../fuzz/fake-execserver.js";
import { spawnExecserver, type ExecserverProcess } from "../../harness/execserver-process.js";
import { startReplica, stopReplica, type FylrReplica } from "../support/fylr-replica.js";
import { release, track } from "../../harness/resources.js";

const sha256 = (data: Uint8Array): string => createHash("sha256").update(data).digest("hex");

/** Counts the replica's in-pipes made and the pipe GETs that reached them. */
function countInPipes(replica: FylrReplica): { created: number; opened: number } {
  const counts = { created: 0, opened: 0 };
  const { pipes } = replica;
  const createInPipe = pipes.createInPipe.bind(pipes);
  const openIn = pipes.openIn.bind(pipes);
  pipes.createInPipe = (...args) => (counts.created++, createInPipe(...args));
  pipes.openIn = (...args) => (counts.opened++, openIn(...args));
  return counts;
}

describe("fylr: small stdin inside the JOB frame (stdin_inline)", function () {
  this.timeout(60_000);

  describe("against an execserver process with the capability", () => {
    let server: ExecserverProcess;
    let replica: FylrReplica;
    before(async () => {
      server = await spawnExecserver({
        instanceId: "exec-inline",
        waitgroups: { w: { processes: 2 } },
        services: { cat: { waitgroup: "w", command: ["cat"] }, sha: { waitgroup: "w", command: ["sha256sum"] } },
      });
    });
    after(() => release(server));
    beforeEach(async () => {
      replica = await startReplica({ addresses: [server.grpcAddress], connectTimeout: "30s" }, "inline");
    });
    afterEach(() => stopReplica(replica));

    it("sends a 4 KiB stdin inline: the command gets it, no in-pipe is made, no pipe GET happens", async () => {
      const counts = countInPipes(replica);
      const input = randomBytes(4096);
      const result = await replica.exec.run({ service: "sha", stdin: input });
      expect(result.receipt.exitCode, result.receipt.stderrLine).to.equal(0);
      expect(result.stdout!.toString()).to.equal(`${sha256(input)}  -\n`);
      expect(result.stdinUrl).to.equal(undefined);
      expect(counts).to.deep.equal({ created: 0, opened: 0 });
    });

    it("sends exactly 64 KiB inline, and stdout over 4000 bytes still goes by the out-pipe", async () => {
      const counts = countInPipes(replica);
      const input = randomBytes(jobSpecLimits.stdinInlineBytes);
      const result = await replica.exec.run({ service: "cat", stdin: input });
      expect(result.stdout!.equals(input)).to.equal(true);
      expect(result.receipt.stdoutStreamed).to.equal(true);
      expect(counts).to.deep.equal({ created: 0, opened: 0 });
    });

    it("serves a larger stdin, or a stream, through an in-pipe as before", async () => {
      const counts = countInPipes(replica);
      const large = randomBytes(jobSpecLimits.stdinInlineBytes + 1);
      const big = await replica.exec.run({ service: "sha", stdin: large });
      expect(big.stdout!.toString()).to.equal(`${sha256(large)}  -\n`);
      expect(big.stdinUrl).to.be.a("string");
      const small = Buffer.from("streamed");
      const streamed = await replica.exec.run({ service: "sha", stdin: Readable.from([small]) });
      expect(streamed.stdout!.toString()).to.equal(`${sha256(small)}  -\n`);
      expect(counts).to.deep.equal({ created: 2, opened: 2 });
    });
  });

  describe("against an execserver without the capability", () => {
    let fake: FakeExecserver;
    let replica: FylrReplica;
    afterEach(async () => {
      await stopReplica(replica);
      await release(fake);
    });

    it("sends stdin_url and no stdin_inline, and the old server reads stdin from the pipe", async () => {
      fake = track(
        await FakeExecserver.start({
          // Plays an old execserver: GETs stdin_url and answers with its hash.
          onJob: async (job, stream) => {
            const body = Buffer.from(await (await fetch(job.spec!.stdinUrl)).arrayBuffer());
            const stdout = Buffer.from(`${sha256(body)}  -\n`);
            stream.send({ case: "done", value: { jobId: job.jobId, receipt: { exitCode: 0, stdoutPrefix: stdout, stdoutBytes: BigInt(stdout.length), duration: durationFromMs(1) } } });
          },
        }),
        "fake execserver",
        (f) => f.close(),
      );
      replica = await startReplica({ addresses: [fake.address], connectTimeout: "30s" }, "old-server");
      const counts = countInPipes(replica);
      const input = randomBytes(4096);
      const result = await replica.exec.run({ service: "fz", stdin: input });
      expect(result.stdout!.toString()).to.equal(`${sha256(input)}  -\n`);
      const [job] = [...fake.jobs.values()];
      expect(job!.spec!.stdinUrl).to.match(/^http:\/\/127\.0\.0\.1:\d+\//);
      expect(job!.spec!.stdinInline).to.have.length(0);
      expect(counts).to.deep.equal({ created: 1, opened: 1 });
    });
  });
});
