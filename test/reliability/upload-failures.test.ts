// Findings 1 and 2 of the trust review, with real processes: a job whose stdout upload
// is aborted (it printed more than the receipt holds, then failed or timed out), a bare
// chunked PUT that stops mid-body, and a receipt that says "streamed" for an out-pipe
// nobody opened (from a real execserver, and from a scripted one that reports whatever it
// likes). The fylr must record each as a failed attempt with a clear reason and stay up;
// none of them may crash it.
import { connect, createServer, type Server, type Socket } from "node:net";
import { expect } from "chai";
import type pg from "pg";
import { ItemState, type Item } from "../../gen/slotbroker/v1/queue_pb.js";
import { spawnExecserver, waitFor, type ExecserverProcess } from "../../harness/execserver-process.js";
import { createTestDatabase } from "../support/postgres.js";
import { startReplica, stopReplica } from "../support/fylr-replica.js";
import { closeAll, fastFylrConfig, openPool, spawnFylr, type FylrProcess } from "../integration/support.js";
import { FakeExecserver, type JobHandler } from "../fuzz/fake-execserver.js";

const bigThenFail = ["sh", "-c", "head -c 200000 /dev/zero; sleep 0.3; exit 3"];
const bigThenHang = ["sh", "-c", "head -c 200000 /dev/zero; sleep 30"];
const bigAndFine = ["sh", "-c", "head -c 200000 /dev/zero"];

async function finalItem(fylr: FylrProcess, id: string, timeoutMs = 60_000): Promise<Item> {
  return waitFor(
    `item ${id} to reach a final state`,
    async () => {
      const { item } = await fylr.client.get({ id });
      return item && (item.state === ItemState.SUCCEEDED || item.state === ItemState.FAILED) ? item : undefined;
    },
    timeoutMs,
    100,
  );
}

function expectAlive(fylr: FylrProcess): void {
  expect(fylr.child.exitCode, `the fylr exited; its log:\n${fylr.stderr()}`).to.equal(null);
  expect(fylr.child.signalCode, `the fylr was killed; its log:\n${fylr.stderr()}`).to.equal(null);
  expect(fylr.stderr()).not.to.match(/Unhandled 'error' event|uncaught/i);
}

describe("reliability: aborted uploads and contradicting receipts never crash a fylr", () => {
  let databaseUrl: string;
  let pool: pg.Pool;
  // One execserver for the file, started before the tests (the leak check closes what a
  // test leaves running); a test's jobs end with its fylr. Some tests talk to a fake.
  let exec: ExecserverProcess | undefined;
  let fylr: FylrProcess | undefined;
  let interceptor: Server | undefined;
  let fake: FakeExecserver | undefined;

  before(async () => {
    databaseUrl = await createTestDatabase("upload_failures");
    exec = await spawnExecserver({
      instanceId: "exec-uploads",
      waitgroups: { w: { processes: 4 } },
      services: {
        "big-then-fail": { waitgroup: "w", command: bigThenFail },
        "big-then-hang": { waitgroup: "w", command: bigThenHang, timeout: "1s" },
        "big-and-fine": { waitgroup: "w", command: bigAndFine },
      },
    });
  });
  after(async () => {
    await closeAll(exec);
    exec = undefined;
  });
  beforeEach(async () => {
    pool = openPool(databaseUrl);
    await pool.query("DROP SCHEMA public CASCADE; CREATE SCHEMA public");
  });
  afterEach(async () => {
    await closeAll(fylr, pool);
    await fake?.close();
    fake = undefined;
    if (interceptor) await new Promise((done) => interceptor!.close(() => done(undefined)));
    fylr = interceptor = undefined;
  });

  // A listener on 127.0.0.2 at the fylr's own port, where pipe URLs with pipeHost 127.0.0.2
  // land: it learns the path of the first PUT and holds every socket. Bound after the fylr,
  // which already holds the port on 127.0.0.1, so no other socket can be handed it.
  const interceptUploads = async (f: FylrProcess): Promise<{ port: number; held: Socket[]; pipePath: Promise<string> }> => {
    const port = Number(new URL(f.url).port);
    const held: Socket[] = [];
    let found!: (path: string) => void;
    const pipePath = new Promise<string>((resolve) => (found = resolve));
    const server = (interceptor = createServer((socket) => {
      held.push(socket);
      socket.once("data", (head: Buffer) => found(/^PUT (\S+) /.exec(head.toString("latin1"))?.[1] ?? ""));
    }));
    await new Promise<void>((resolve, reject) => {
      server.once("error", reject);
      server.listen(port, "127.0.0.2", resolve);
    });
    return { port, held, pipePath };
  };

  it("finding 1: a job that prints 200 KB and exits 3 fails with its exit code; the fylr stays up", async function () {
    this.timeout(90_000);
    fylr = await spawnFylr(fastFylrConfig(databaseUrl, [exec!.grpcAddress]), "f-fail");
    const { item } = await fylr.client.submit({ calls: [{ service: "big-then-fail" }], maxAttempts: 2 });
    const done = await finalItem(fylr, item!.id);
    expectAlive(fylr);
    expect(done.state).to.equal(ItemState.FAILED);
    // Said once, with what happened to the output.
    expect(done.error).to.match(/^calls\[0\] \(big-then-fail\): exited with code 3: stdout upload aborted after \d+ bytes$/);
    expect(done.error).not.to.match(/heartbeat/);
  });

  it("finding 1: the exec client collecting stdout in memory returns the failed receipt of a job that printed 200 KB", async function () {
    this.timeout(60_000);
    const replica = await startReplica({ addresses: [exec!.grpcAddress], connectTimeout: "30s" }, "collector");
    try {
      for (const service of ["big-then-fail", "big-then-hang"]) {
        const result = await replica.exec.run({ service });
        expect(result.receipt.exitCode === 3 || result.receipt.signal !== "", `${service}: ${JSON.stringify(result.receipt.errorMessage)}`).to.equal(true);
        expect(result.stdoutError?.message).to.match(/pipe aborted/);
      }
    } finally {
      await stopReplica(replica);
    }
  });

  it("finding 2: the exec client collecting stdout in memory survives a receipt that says stdout streamed to a pipe never opened", async function () {
    this.timeout(60_000);
    // Nothing listens on 127.0.0.2: the execserver cannot open the out-pipe, yet its
    // receipt says the output was streamed.
    const replica = await startReplica({ addresses: [exec!.grpcAddress], connectTimeout: "30s", pipeHost: "127.0.0.2" }, "unreachable");
    try {
      const result = await replica.exec.run({ service: "big-and-fine" });
      // An 'error' event nobody listens to would surface as an uncaught exception now.
      await new Promise((r) => setTimeout(r, 200));
      expect(result.receipt.stdoutStreamed).to.equal(true);
      expect(result.receipt.errorMessage).to.match(/stdout upload failed/);
      expect(result.stdoutError?.message).to.match(/out-pipe was never opened/);
    } finally {
      await stopReplica(replica);
    }
  });

  it("finding 1: a job killed by its timeout after printing 200 KB fails as timed out; the fylr stays up", async function () {
    this.timeout(90_000);
    fylr = await spawnFylr(fastFylrConfig(databaseUrl, [exec!.grpcAddress]), "f-timeout");
    const { item } = await fylr.client.submit({ calls: [{ service: "big-then-hang" }], maxAttempts: 1 });
    const done = await finalItem(fylr, item!.id);
    expectAlive(fylr);
    expect(done.state).to.equal(ItemState.FAILED);
    expect(done.error).to.match(/time/i);
    expect(done.error).not.to.match(/heartbeat/);
  });

  it("finding 1: a bare chunked PUT of 4 KiB to a live out-pipe, then a closed socket, fails that attempt only", async function () {
    this.timeout(90_000);
    // The fylr's pipe URLs name 127.0.0.2: the execserver's upload lands on this test's
    // listener, which learns the live out-pipe id and holds the execserver's upload.
    fylr = await spawnFylr(fastFylrConfig(databaseUrl, [exec!.grpcAddress], { execserver: { addresses: [exec!.grpcAddress], pipeHost: "127.0.0.2" } }), "f-bare-put");
    const { port, held, pipePath } = await interceptUploads(fylr);
    const { item } = await fylr.client.submit({ calls: [{ service: "big-and-fine" }], maxAttempts: 1 });
    const path = await pipePath;
    expect(path).to.match(/^\/pipe\/out\//);
    const hostile = connect(port, "127.0.0.1");
    await new Promise((ready) => hostile.once("connect", ready));
    hostile.write(`PUT ${path} HTTP/1.1\r\nhost: 127.0.0.1\r\ntransfer-encoding: chunked\r\n\r\n1000\r\n`);
    hostile.write(Buffer.alloc(4096, 0x61));
    hostile.write("\r\n");
    await new Promise((r) => setTimeout(r, 200));
    hostile.destroy();
    for (const socket of held) socket.destroy();
    const done = await finalItem(fylr, item!.id);
    expectAlive(fylr);
    expect(done.state).to.equal(ItemState.FAILED);
    expect(done.error).to.match(/stdout|upload|pipe/i);
    expect(done.error).not.to.match(/heartbeat/);
    // The fylr keeps serving: another item runs to success.
    const { item: next } = await fylr.client.submit({ calls: [{ service: "big-then-fail" }], maxAttempts: 1 });
    expect((await finalItem(fylr, next!.id)).error).to.match(/3/);
    expectAlive(fylr);
  });

  it("finding 7: a second concurrent PUT to one out-pipe is a 409; the first upload goes on", async function () {
    this.timeout(90_000);
    fylr = await spawnFylr(fastFylrConfig(databaseUrl, [exec!.grpcAddress], { execserver: { addresses: [exec!.grpcAddress], pipeHost: "127.0.0.2" } }), "f-second-put");
    const { port, held, pipePath } = await interceptUploads(fylr);
    await fylr.client.submit({ calls: [{ service: "big-and-fine" }], maxAttempts: 1 });
    const path = await pipePath;
    const first = connect(port, "127.0.0.1");
    await new Promise((ready) => first.once("connect", ready));
    first.write(`PUT ${path} HTTP/1.1\r\nhost: 127.0.0.1\r\ntransfer-encoding: chunked\r\n\r\n4\r\nabcd\r\n`);
    await new Promise((r) => setTimeout(r, 200));
    const second = await fetch(`http://127.0.0.1:${port}${path}`, { method: "PUT", body: "second" });
    expect(second.status, await second.text()).to.equal(409);
    first.write("0\r\n\r\n");
    const answer = await new Promise<string>((done) => first.once("data", (b: Buffer) => done(b.toString("latin1"))));
    expect(answer).to.match(/^HTTP\/1.1 200 /);
    first.destroy();
    for (const socket of held) socket.destroy();
    expectAlive(fylr);
  });

  it("finding 2: a receipt saying stdout was streamed to an out-pipe nobody opened fails the attempt; the fylr stays up", async function () {
    this.timeout(90_000);
    // Nothing listens on 127.0.0.2 at the fylr's port: the execserver cannot open the out-pipe.
    fylr = await spawnFylr(fastFylrConfig(databaseUrl, [exec!.grpcAddress], { execserver: { addresses: [exec!.grpcAddress], pipeHost: "127.0.0.2" } }), "f-unreachable");
    const { item } = await fylr.client.submit({ calls: [{ service: "big-and-fine" }], maxAttempts: 2 });
    const done = await finalItem(fylr, item!.id);
    expectAlive(fylr);
    expect(done.state).to.equal(ItemState.FAILED);
    expect(done.error).to.match(/stdout|upload|pipe/i);
    expect(done.error).not.to.match(/heartbeat/);
  });
  // Another execserver implementation (here a scripted one) may upload and report however
  // it likes: the fylr must judge the receipt against what its pipe actually received.
  const withFakeExecserver = async (onJob: JobHandler, name: string): Promise<FylrProcess> => {
    fake = await FakeExecserver.start({ onJob });
    return (fylr = await spawnFylr(fastFylrConfig(databaseUrl, [fake.address]), name));
  };

  it("finding 1: an execserver's chunked PUT of 4 KiB cut off mid-body, then a success receipt: the attempt fails naming the cut-off upload; the fylr stays up", async function () {
    this.timeout(90_000);
    await withFakeExecserver(async (job, stream) => {
      const out = new URL(job.spec!.stdoutUrl);
      const socket = connect(Number(out.port), out.hostname);
      await new Promise((ready) => socket.once("connect", ready));
      socket.write(`PUT ${out.pathname} HTTP/1.1\r\nhost: ${out.host}\r\ntransfer-encoding: chunked\r\n\r\n1000\r\n`);
      socket.write(Buffer.alloc(4096, 0x61));
      await new Promise((r) => setTimeout(r, 200));
      socket.destroy();
      stream.send({ case: "done", value: { jobId: job.jobId, receipt: { exitCode: 0, stdoutStreamed: true, stdoutBytes: 4096n, instanceId: "fake-exec" } } });
    }, "f-cut-put");
    const { item } = await fylr!.client.submit({ calls: [{ service: "fz" }], maxAttempts: 2 });
    const done = await finalItem(fylr!, item!.id);
    expectAlive(fylr!);
    expect(done.state).to.equal(ItemState.FAILED);
    expect(done.error).to.match(/reported success but its stdout upload failed: pipe aborted: the uploader disconnected before the body ended$/);
  });

  it("finding 2: an execserver's success receipt saying stdout was streamed to an out-pipe it never opened fails the attempt, saying so; the fylr stays up", async function () {
    this.timeout(90_000);
    await withFakeExecserver((job, stream) => {
      stream.send({ case: "done", value: { jobId: job.jobId, receipt: { exitCode: 0, stdoutStreamed: true, stdoutBytes: 200_000n, stdoutPrefix: Buffer.alloc(4000, 0x61), instanceId: "fake-exec" } } });
    }, "f-never-opened");
    const { item } = await fylr!.client.submit({ calls: [{ service: "fz" }], maxAttempts: 2 });
    const done = await finalItem(fylr!, item!.id);
    expectAlive(fylr!);
    expect(done.state).to.equal(ItemState.FAILED);
    expect(done.error).to.match(/reported success but its stdout upload failed: pipe cancelled: the receipt says stdout was streamed, but the out-pipe was never opened$/);
  });
});
