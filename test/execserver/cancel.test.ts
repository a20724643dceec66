import { expect } from "chai";
import { existsSync, mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { ErrorKind, PositionState } from "../../gen/slotbroker/v1/broker_pb.js";
import { groupGone, livingMembers } from "../support/process-group.js";
import { BrokerStream, eventually, releaseAll } from "./support/broker-stream.js";
import { startTestServer } from "./support/server.js";

// A job that records its process group id, starts a grandchild in the same group, and
// ignores SIGTERM: only the SIGKILL after the cancel grace can end it.
const stubborn = ["sh", "-c", 'echo $$ > "$1"; trap "" TERM; sleep 60 & wait; wait', "stubborn"];


describe("execserver: the Cancel frame", () => {
  let dir: string;
  beforeEach(() => (dir = mkdtempSync(join(tmpdir(), "slotbroker-cancel-"))));
  afterEach(async () => {
    await releaseAll();
    rmSync(dir, { recursive: true, force: true });
  });

  const server = (cancelGrace = "200ms") =>
    startTestServer({
      cancelGrace,
      services: {
        noop: { waitgroup: "one", builtin: "noop" },
        stubborn: { waitgroup: "slow", command: stubborn, timeout: "1m" },
        sleep: { waitgroup: "slow", command: ["sleep"], timeout: "1m" },
      },
    });

  async function runningJob(stream: BrokerStream, jobId: string): Promise<number> {
    const pidFile = join(dir, `${jobId}.pid`);
    stream.want(jobId, "stubborn");
    const offer = await stream.next("offer");
    stream.job(jobId, offer.offerToken, { args: [pidFile] });
    return eventually(() => {
      if (!existsSync(pidFile)) throw new Error("the job has not written its pid yet");
      const pid = Number(readFileSync(pidFile, "utf8").trim());
      if (!pid) throw new Error("empty pid file");
      return pid;
    });
  }

  it("is advertised as the \"cancel\" capability", async () => {
    const s = await server();
    const stream = await BrokerStream.open(s.grpcAddress);
    expect(stream.received[0]!.frame.case).to.equal("hello");
    const hello = stream.received[0]!.frame.value as { capabilities: string[] };
    expect(hello.capabilities).to.include("cancel");
  });

  it("stops a running job: SIGTERM, SIGKILL after the grace, DONE says CANCEL_REQUESTED, the group is gone", async () => {
    const s = await server("300ms");
    const stream = await BrokerStream.open(s.grpcAddress);
    const pgid = await runningJob(stream, "j1");
    expect(await livingMembers(pgid)).to.have.length.at.least(1);
    const sentAt = performance.now();
    stream.send({ case: "cancel", value: { $typeName: "slotbroker.v1.Cancel", jobId: "j1" } });
    const done = await stream.next("done");
    const tookMs = performance.now() - sentAt;
    expect(done.jobId).to.equal("j1");
    expect(done.receipt!.error).to.equal(ErrorKind.CANCEL_REQUESTED);
    expect(done.receipt!.signal).to.equal("SIGKILL");
    // SIGTERM was ignored, so the SIGKILL came after the grace.
    expect(tookMs).to.be.at.least(250);
    expect(await groupGone(pgid)).to.equal(true);
    // The slot is free again.
    stream.want("j2", "sleep");
    await stream.next("offer");
  });

  it("sends exactly one DONE however often Cancel is repeated, and ignores unknown ids", async () => {
    const s = await server("50ms");
    const stream = await BrokerStream.open(s.grpcAddress);
    const pgid = await runningJob(stream, "j1");
    const cancel = (jobId: string): void => stream.send({ case: "cancel", value: { $typeName: "slotbroker.v1.Cancel", jobId } });
    cancel("nobody");
    cancel("j1");
    cancel("j1");
    await stream.next("done");
    cancel("j1");
    await stream.ping();
    expect(stream.unconsumed("done")).to.have.length(0);
    expect(stream.unconsumed("reject")).to.have.length(0);
    expect(await groupGone(pgid)).to.equal(true);
  });

  it("withdraws a parked want as UNWANT would", async () => {
    const s = await server();
    const holder = await BrokerStream.open(s.grpcAddress);
    const pgid = await runningJob(holder, "busy");
    const other = await BrokerStream.open(s.grpcAddress);
    other.want("w1", "sleep");
    other.query("w1");
    expect((await other.next("position")).state).to.equal(PositionState.PARKED);
    other.send({ case: "cancel", value: { $typeName: "slotbroker.v1.Cancel", jobId: "w1" } });
    other.query("w1");
    expect((await other.next("position")).state).to.equal(PositionState.UNSPECIFIED);
    // When the slot frees, the cancelled want gets no offer; a new want does.
    holder.send({ case: "cancel", value: { $typeName: "slotbroker.v1.Cancel", jobId: "busy" } });
    await holder.next("done");
    expect(await groupGone(pgid)).to.equal(true);
    other.want("w2", "sleep");
    const offer = await other.next("offer");
    expect(offer.jobId).to.equal("w2");
  });

  it("withdraws an offer: the slot goes to the next want at once", async () => {
    const s = await server();
    const a = await BrokerStream.open(s.grpcAddress);
    const b = await BrokerStream.open(s.grpcAddress);
    a.want("a1", "sleep");
    const offer = await a.next("offer");
    b.want("b1", "sleep");
    await b.ping();
    a.send({ case: "cancel", value: { $typeName: "slotbroker.v1.Cancel", jobId: "a1" } });
    expect((await b.next("offer")).jobId).to.equal("b1");
    // The cancelled offer's token is stale now: nothing runs.
    a.job("a1", offer.offerToken, { args: ["60"] });
    const reject = await a.next("reject");
    expect(reject.jobId).to.equal("a1");
  });
});
