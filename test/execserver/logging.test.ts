// An operator reading an execserver's log at the default level (info) sees every connection
// open and close, every refused connection, rejected frame, expired offer and failed job
// (with the job's pid and the signal that ended it).
import { expect } from "chai";
import { RejectCode } from "../../gen/slotbroker/v1/broker_pb.js";
import { spawnExecserver, stopExecserver, waitFor, type ExecserverProcess } from "../../harness/execserver-process.js";
import { BrokerStream, releaseAll } from "./support/broker-stream.js";

type Line = Record<string, unknown> & { level: number; msg: string };

function lines(proc: ExecserverProcess): Line[] {
  return proc
    .stderr()
    .split("\n")
    .filter((l) => l.startsWith("{"))
    .map((l) => JSON.parse(l) as Line);
}

function logged(proc: ExecserverProcess, msg: string, match: Record<string, unknown> = {}): Promise<Line> {
  return waitFor(`log "${msg}" ${JSON.stringify(match)}`, () =>
    lines(proc).find((l) => l.msg === msg && Object.entries(match).every(([k, v]) => l[k] === v)),
  );
}

const info = 30;
const warn = 40;

describe("execserver log at the default level", function () {
  this.timeout(30_000);
  let proc: ExecserverProcess;
  before(async () => {
    proc = await spawnExecserver(
      {
        token: "s3cret",
        offerTimeout: "300ms",
        waitgroups: { w: { processes: 2 } },
        services: {
          broken: { waitgroup: "w", command: ["sh", "-c", "echo 'disk on fire' >&2; exit 3"] },
          slow: { waitgroup: "w", command: ["sleep"], timeout: "1s" },
        },
      },
      { logLevel: "info" },
    );
  });
  after(() => stopExecserver(proc));
  afterEach(releaseAll);

  it("logs connections, refusals, rejects, expired offers and failed jobs, never the token", async () => {
    const intruder = await BrokerStream.open(proc.grpcAddress, { token: "wrong", awaitHello: false });
    await intruder.ended;
    expect((await logged(proc, "refused a connection: missing or wrong bearer token")).level).to.equal(warn);

    const stream = await BrokerStream.open(proc.grpcAddress, { token: "s3cret", clientName: "log-test" });
    const opened = await logged(proc, "connection opened", { client: "log-test" });
    expect(opened.level).to.equal(info);
    const conn = opened.conn;

    stream.want("j-unknown", "nope");
    expect((await stream.next("reject")).code).to.equal(RejectCode.UNKNOWN_SERVICE);
    expect((await logged(proc, "frame rejected", { jobId: "j-unknown" })).code).to.equal("UNKNOWN_SERVICE");

    stream.job("j-stale", "no-such-token");
    await stream.next("reject");
    expect((await logged(proc, "frame rejected", { jobId: "j-stale" })).code).to.equal("STALE_OFFER");

    stream.want("j-expire", "slow");
    await stream.next("offer");
    expect((await logged(proc, "offer expired unanswered; the slot goes to the next want", { jobId: "j-expire" })).level).to.equal(info);

    stream.want("j-fail", "broken");
    const offer = await stream.next("offer");
    stream.job("j-fail", offer.offerToken);
    expect((await stream.next("done")).receipt?.exitCode).to.equal(3);
    const failed = await logged(proc, "job failed", { jobId: "j-fail" });
    expect(failed).to.deep.include({ level: info, service: "broken", exitCode: 3, stderr: "disk on fire", conn });

    stream.want("j-timeout", "slow");
    const slowOffer = await stream.next("offer");
    stream.job("j-timeout", slowOffer.offerToken, { args: ["5"] });
    await stream.next("done", 10_000);
    const timedOut = await logged(proc, "job failed", { jobId: "j-timeout" });
    expect(timedOut).to.deep.include({ level: warn, error: "TIMEOUT", signal: "SIGTERM" });
    // The job's own pid (the line's "pid" is the execserver's): a job killed without a trace
    // of its own can be matched to its outcome.
    expect(timedOut.jobPid).to.be.a("number").and.not.equal(timedOut.pid);
    expect(failed.jobPid).to.be.a("number").and.not.equal(timedOut.jobPid);

    await stream.close();
    const closed = await logged(proc, "connection closed", { conn });
    expect(closed).to.deep.include({ level: info, rejects: 2 });
    expect(proc.stderr()).to.not.contain("s3cret");
  });
});
