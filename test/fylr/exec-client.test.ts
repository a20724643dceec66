import { expect } from "chai";
import { createHash, randomBytes } from "node:crypto";
import { getEventListeners } from "node:events";
import { createServer } from "node:http";
import type { AddressInfo } from "node:net";
import { Readable, Writable } from "node:stream";
import { ErrorKind } from "../../gen/slotbroker/v1/broker_pb.js";
import { execBackend } from "../../src/app/exec-adapters.js";
import { splitHostPort } from "../../src/shared/config-parsing.js";
import { spawnExecserver, waitFor, type ExecserverProcess } from "../../harness/execserver-process.js";
import { startReplica, stopReplica, type FylrReplica } from "../support/fylr-replica.js";
import { release } from "../../harness/resources.js";

const MiB = 1024 * 1024;

/** A Writable that hashes and counts what it gets. */
class HashSink extends Writable {
  private readonly hash = createHash("sha256");
  bytes = 0;
  override _write(chunk: Buffer, _enc: BufferEncoding, callback: () => void): void {
    this.hash.update(chunk);
    this.bytes += chunk.byteLength;
    callback();
  }
  digest(): string {
    return this.hash.digest("hex");
  }
}

/** `total` pseudo-random bytes in 1 MiB chunks; `digest` is known once it ended. */
function randomSource(total: number): { stream: Readable; digest: () => string } {
  const hash = createHash("sha256");
  let sent = 0;
  const stream = new Readable({
    read() {
      if (sent >= total) return void this.push(null);
      const chunk = randomBytes(Math.min(MiB, total - sent));
      sent += chunk.byteLength;
      hash.update(chunk);
      this.push(chunk);
    },
  });
  return { stream, digest: () => hash.digest("hex") };
}

function finished(stream: Writable): Promise<void> {
  return new Promise((resolve, reject) => {
    if (stream.writableFinished) return resolve();
    stream.once("finish", resolve);
    stream.once("error", reject);
  });
}

const services = {
  cat: { waitgroup: "w", command: ["cat"] },
  printf: { waitgroup: "w", command: ["printf"] },
  sh: { waitgroup: "w", command: ["sh", "-c"], env: ["FOO"] },
  sleep: { waitgroup: "w", command: ["sleep"] },
};

describe("fylr exec client against an execserver process", function () {
  this.timeout(120_000);
  let server: ExecserverProcess;
  let replica: FylrReplica;

  before(async () => {
    server = await spawnExecserver({ instanceId: "exec-x", waitgroups: { w: { processes: 4 } }, services });
  });
  after(() => release(server));
  beforeEach(async () => {
    replica = await startReplica({ addresses: [server.grpcAddress], connectTimeout: "30s" }, "exec");
  });
  afterEach(() => stopReplica(replica));

  it("round-trips 64 MiB of stdin through cat to stdout, byte for byte", async () => {
    const source = randomSource(64 * MiB);
    const sink = new HashSink();
    const result = await replica.exec.run({ service: "cat", stdin: source.stream, stdout: sink });
    await finished(sink);
    expect(result.receipt.exitCode, result.receipt.stderrLine).to.equal(0);
    expect(result.receipt.stdoutStreamed).to.equal(true);
    expect(result.receipt.stdoutBytes).to.equal(BigInt(64 * MiB));
    expect(sink.bytes).to.equal(64 * MiB);
    expect(sink.digest()).to.equal(source.digest());
    expect(result.stdout).to.equal(undefined);
    expect(replica.pipes.size, "both pipes settled").to.equal(0);
  });

  it("collects stdout into a Buffer and takes stdin from a Buffer", async () => {
    const input = randomBytes(10_000);
    const result = await replica.exec.run({ service: "cat", stdin: input });
    expect(result.stdout!.equals(input)).to.equal(true);
    expect(result.receipt.stdoutStreamed).to.equal(true);
  });

  it("delivers small output from the receipt and never uses the out-pipe", async () => {
    const chunks: Buffer[] = [];
    const stdout = new Writable({
      write(chunk: Buffer, _enc, cb) {
        chunks.push(chunk);
        cb();
      },
    });
    const result = await replica.exec.run({ service: "printf", args: ["%s", "hello"], stdout });
    await finished(stdout);
    expect(Buffer.concat(chunks).toString()).to.equal("hello");
    expect(result.receipt.stdoutStreamed).to.equal(false);
    expect(Buffer.from(result.receipt.stdoutPrefix).toString()).to.equal("hello");
    // The out-pipe was cancelled unused: its URL now answers 410 "cancelled", not "used".
    const late = await fetch(result.stdoutUrl, { method: "PUT", body: "x" });
    expect(late.status).to.equal(410);
    expect(await late.text()).to.match(/cancelled/);
    expect(result.stdinUrl).to.equal(undefined);
  });

  it("cancels an in-pipe the command never read", async () => {
    // A stream, not bytes: small bytes would ride inline in the JOB frame, with no in-pipe.
    const result = await replica.exec.run({ service: "printf", args: ["x"], stdin: Readable.from([Buffer.from("unread")]) });
    expect(result.stdout!.toString()).to.equal("x");
    const late = await fetch(result.stdinUrl!);
    expect(late.status).to.equal(410);
  });

  it("surfaces an aborted upload as an error on the caller's stdout, with the failed receipt", async () => {
    const sink = new HashSink();
    const errored = new Promise<Error>((resolve) => sink.once("error", resolve));
    const result = await replica.exec.run({ service: "sh", args: ["head -c 100000 /dev/zero; echo boom >&2; exit 3"], stdout: sink });
    expect(result.receipt.exitCode).to.equal(3);
    expect(result.receipt.stderrLine).to.equal("boom");
    expect(result.stdoutError).to.be.instanceOf(Error);
    // The execserver aborts the upload when the job fails: the fylr sees the PUT aborted, or,
    // when the abort came before the PUT had reached it, no PUT at all behind a streamed receipt.
    expect((await errored).message).to.match(/abort|the out-pipe was never opened/i);
    expect(sink.destroyed).to.equal(true);
  });

  it("passes env and the timeout through the job spec", async () => {
    const env = await replica.exec.run({ service: "sh", args: ["printf %s \"$FOO\""], env: { FOO: "bar" } });
    expect(env.stdout!.toString()).to.equal("bar");
    const slow = await replica.exec.run({ service: "sleep", args: ["10"], timeoutMs: 200 });
    expect(slow.receipt.error).to.equal(ErrorKind.TIMEOUT);
  });

  it("UNWANTs when the signal aborts while parked, and cancels the pipes of a running job", async () => {
    const busy = Array.from({ length: 4 }, () => replica.exec.run({ service: "sleep", args: ["1"] }));
    await waitFor("all four slots busy", async () => (await server.status()).waitgroups[0]!.running === 4);
    const controller = new AbortController();
    const parked = replica.exec.run({ service: "cat", stdin: Buffer.from("x"), signal: controller.signal });
    await waitFor("the want parked", async () => (await server.status()).waitgroups[0]!.waiting === 1n);
    controller.abort(new Error("caller gave up"));
    const err = await parked.then(() => expect.fail("expected an abort"), (e: unknown) => e);
    expect((err as Error).message).to.equal("caller gave up");
    await waitFor("the UNWANT", async () => (await server.status()).waitgroups[0]!.waiting === 0n);
    await Promise.all(busy);

    const running = new AbortController();
    const endless = new Readable({ read() {} });
    endless.push(Buffer.alloc(10_000));
    const sink = new HashSink();
    const sinkErrors: Error[] = [];
    sink.on("error", (e) => sinkErrors.push(e));
    const job = replica.exec.run({ service: "cat", stdin: endless, stdout: sink, signal: running.signal });
    await waitFor("the job to run", async () => (await server.status()).waitgroups[0]!.running === 1);
    running.abort(new Error("stop"));
    const jobErr = await job.then(() => expect.fail("expected an abort"), (e: unknown) => e);
    expect((jobErr as Error).message).to.equal("stop");
    await waitFor("the execserver to end the job", async () => (await server.status()).waitgroups[0]!.running === 0);
    expect(endless.destroyed).to.equal(true);
    // Depending on when the abort lands, stdout had started streaming or not; either way the
    // caller never sees a clean end of a short stream.
    if (sink.bytes > 0) expect(sinkErrors.map((e) => e.message).join()).to.match(/cancelled|stop/);
    expect(sink.writableFinished).to.equal(false);
  });

  it("takes its listeners off the caller's signal once a job is over, run or refused", async () => {
    const controller = new AbortController();
    const ok = await replica.exec.run({ service: "printf", args: ["ok"], stdin: Buffer.from("x"), signal: controller.signal });
    expect(ok.stdout!.toString()).to.equal("ok");
    expect(getEventListeners(controller.signal, "abort")).to.have.length(0);
    const unknown = await replica.exec.run({ service: "nope", signal: controller.signal }).catch((e: Error) => e);
    expect(unknown).to.be.instanceOf(Error);
    expect(getEventListeners(controller.signal, "abort")).to.have.length(0);
  });

  it("makes a stdout stream given as a function only when stdout streams", async () => {
    let made = 0;
    const collected: Buffer[] = [];
    const make = (): Writable => {
      made += 1;
      return new Writable({
        write: (chunk: Buffer, _encoding, callback) => {
          collected.push(chunk);
          callback();
        },
      });
    };
    const small = await replica.exec.run({ service: "printf", args: ["small"], stdout: make });
    expect(small.stdout!.toString()).to.equal("small");
    expect(made).to.equal(0);
    const large = await replica.exec.run({ service: "cat", stdin: Buffer.alloc(5000, 1), stdout: make });
    expect(made).to.equal(1);
    expect(large.stdout).to.equal(undefined);
    expect(Buffer.concat(collected).equals(Buffer.alloc(5000, 1))).to.equal(true);
  });

  it("refuses labels that would make the JOB frame too big, before a slot is taken", async () => {
    const labels = { big: "x".repeat(1024 * 1024) };
    const err = await replica.exec.run({ service: "printf", args: ["a"], labels }).catch((e: Error) => e);
    expect((err as Error).message).to.match(/^the job spec is \d+ bytes; a JOB frame must stay under 1048576 bytes$/);
    expect((await server.status()).waitgroups[0]!.waiting).to.equal(0n);
    const small = await replica.exec.run({ service: "printf", args: ["a"], labels: { who: "test" } });
    expect(small.stdout!.toString()).to.equal("a");
  });

  it("uses the configured pipeHost instead of the local address", async () => {
    const natted = await startReplica({ addresses: [server.grpcAddress], pipeHost: "localhost" }, "nat");
    try {
      const result = await natted.exec.run({ service: "cat", stdin: Buffer.alloc(5000, 1) });
      expect(new URL(result.stdoutUrl).hostname).to.equal("localhost");
      expect(result.stdout!.length).to.equal(5000);
    } finally {
      await stopReplica(natted);
    }
  });

  it("serves the dispatcher as its ExecBackend: URL stdin fetched lazily, stdout capped, onStart", async () => {
    const body = randomBytes(20_000);
    let fetched = 0;
    const source = createServer((_req, res) => {
      fetched++;
      res.end(body);
    });
    await new Promise<void>((resolve) => source.listen(0, "127.0.0.1", resolve));
    try {
      const url = new URL(`http://127.0.0.1:${(source.address() as AddressInfo).port}/input`);
      const backend = execBackend(replica.exec);
      const started: string[] = [];
      const result = await backend.run(
        { service: "cat", args: [], env: {}, stdin: url },
        { priority: 3, signal: new AbortController().signal, maxStdoutBytes: 1000, onStart: (id) => started.push(id) },
      );
      expect(fetched).to.equal(1);
      expect(started).to.deep.equal(["exec-x"]);
      expect(result.receipt.stdoutBytes).to.equal(20_000n);
      expect(result.stdout.equals(body.subarray(0, 1000))).to.equal(true);
    } finally {
      await new Promise((resolve) => source.close(resolve));
    }
  });

  it("pins every job's pipe URLs to the replica that made it", async () => {
    const other = await startReplica({ addresses: [server.grpcAddress] }, "other");
    try {
      const replicas = [replica, other];
      const runs = await Promise.all(
        [0, 1, 0, 1].map(async (i) => {
          const input = randomBytes(70_000); // over the inline limit: stdin goes by an in-pipe
          const result = await replicas[i]!.exec.run({ service: "cat", stdin: input });
          return { i, input, result };
        }),
      );
      for (const { i, input, result } of runs) {
        const me = replicas[i]!;
        const conn = me.broker.pools()[0]!.connections()[0]!;
        const local = (await conn.localAddress())!;
        for (const url of [result.stdinUrl!, result.stdoutUrl]) {
          const { hostname, port } = new URL(url);
          expect(`${hostname}:${port}`).to.equal(`${local.host}:${me.http.port}`);
        }
        // The execserver really fetched stdin from, and wrote stdout to, this replica: only
        // its registry had those pipes.
        expect(result.stdout!.equals(input)).to.equal(true);
        expect(splitHostPort(conn.hello!.peerAddress)!.host).to.equal(local.host);
      }
      expect(replica.http.port).to.not.equal(other.http.port);
    } finally {
      await stopReplica(other);
    }
  });
});
