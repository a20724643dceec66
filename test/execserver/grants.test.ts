import { expect } from "chai";
import { ErrorKind, PositionState, RejectCode } from "../../gen/slotbroker/v1/broker_pb.js";
import { durationMs } from "@bufbuild/protobuf/wkt";
import { BrokerStream, eventually, releaseAll, statusClient } from "./support/broker-stream.js";
import { startTestServer } from "./support/server.js";

describe("execserver grants over gRPC", () => {
  afterEach(releaseAll);

  it("answers a WANT on an idle slot at once, runs the JOB and reports DONE", async () => {
    const server = await startTestServer();
    const a = await BrokerStream.open(server.grpcAddress);
    a.want("j1", "noop");
    const offer = await a.next("offer");
    expect(offer.jobId).to.equal("j1");
    expect(offer.waitgroup).to.equal("one");
    expect(offer.offerToken).to.have.length.greaterThan(16);
    expect(durationMs(offer.expiresIn!)).to.equal(5000);
    a.job("j1", offer.offerToken);
    const done = await a.next("done");
    expect(done.jobId).to.equal("j1");
    expect(done.receipt?.exitCode).to.equal(0);
    expect(done.receipt?.instanceId).to.equal("test-exec");
  });

  it("offers a connection with one parked want before a sibling's hundredth", async () => {
    const server = await startTestServer();
    const holder = await BrokerStream.open(server.grpcAddress);
    holder.want("hold", "noop");
    const held = await holder.next("offer");
    const a = await BrokerStream.open(server.grpcAddress);
    const b = await BrokerStream.open(server.grpcAddress);
    for (let i = 1; i <= 100; i++) a.want(`a${i}`, "noop");
    await a.ping();
    b.want("b1", "noop");
    await b.ping();
    holder.decline("hold", held.offerToken);
    const first = await a.next("offer");
    expect(first.jobId).to.equal("a1");
    a.job("a1", first.offerToken);
    await a.next("done");
    const second = await b.next("offer");
    expect(second.jobId).to.equal("b1");
    // The slot is held by b1's offer, so a2 cannot have been offered yet.
    expect(a.unconsumed("offer")).to.deep.equal([]);
    b.decline("b1", second.offerToken);
    expect((await a.next("offer")).jobId).to.equal("a2");
  });

  it("lets a higher-priority want overtake earlier lower ones", async () => {
    const server = await startTestServer();
    const holder = await BrokerStream.open(server.grpcAddress);
    holder.want("hold", "noop");
    const held = await holder.next("offer");
    const a = await BrokerStream.open(server.grpcAddress);
    const b = await BrokerStream.open(server.grpcAddress);
    a.want("low1", "noop", 0);
    a.want("low2", "noop", 0);
    await a.ping();
    b.want("urgent", "noop", 7);
    await b.ping();
    holder.decline("hold", held.offerToken);
    expect((await b.next("offer")).jobId).to.equal("urgent");
    expect(a.unconsumed("offer")).to.deep.equal([]);
  });

  it("moves an unanswered offer to the next connection when it expires, tells the client, and rejects the late JOB", async () => {
    const server = await startTestServer({ offerTimeout: "200ms" });
    const a = await BrokerStream.open(server.grpcAddress);
    const b = await BrokerStream.open(server.grpcAddress);
    a.want("slow", "noop");
    const stale = await a.next("offer");
    b.want("next", "noop");
    const offer = await b.next("offer");
    expect(offer.jobId).to.equal("next");
    // The client whose offer lapsed learns that its want is gone.
    const expired = await a.next("offerExpired");
    expect(expired).to.include({ jobId: "slow", offerToken: stale.offerToken });
    expect(b.unconsumed("offerExpired")).to.deep.equal([]);
    a.job("slow", stale.offerToken);
    const reject = await a.next("reject");
    expect(reject.jobId).to.equal("slow");
    expect(reject.code).to.equal(RejectCode.STALE_OFFER);
    await a.ping();
    const status = server.status();
    const aStatus = status.connections.find((c) => c.expired === 1n)!;
    expect(aStatus.grants).to.equal(0n);
    expect(aStatus.running).to.equal(0);
    expect(status.waitgroups.find((w) => w.name === "one")!.completed).to.equal(0n);
    expect(a.unconsumed("done")).to.deep.equal([]);
  });

  it("frees an expired want's job_id: the same id parks again and is offered the next slot", async () => {
    const server = await startTestServer({ offerTimeout: "100ms" });
    const a = await BrokerStream.open(server.grpcAddress);
    expect(a.received[0]?.frame.case === "hello" && a.received[0].frame.value.capabilities).to.include("offer-expired");
    a.want("again", "noop");
    const first = await a.next("offer");
    await a.next("offerExpired");
    a.want("again", "noop");
    const second = await a.next("offer");
    expect(second.offerToken).to.not.equal(first.offerToken);
    a.job("again", second.offerToken);
    expect((await a.next("done")).receipt?.exitCode).to.equal(0);
    expect(a.unconsumed("reject")).to.deep.equal([]);
  });

  it("a half-closed stream still gets its running job's DONE, then ends OK; its parked want and open offer are withdrawn", async () => {
    const server = await startTestServer({
      waitgroups: { one: { processes: 1 }, slow: { processes: 1 } },
      services: { noop: { waitgroup: "one", builtin: "noop" }, sleep: { waitgroup: "slow", command: ["sleep"], timeout: "1m" } },
    });
    expect(server.status().waitgroups.map((w) => w.name)).to.deep.equal(["one", "slow"]);
    const a = await BrokerStream.open(server.grpcAddress);
    const b = await BrokerStream.open(server.grpcAddress);
    a.want("run", "sleep");
    a.job("run", (await a.next("offer")).offerToken, { args: ["0.7"] });
    a.want("parked", "sleep");
    a.want("offered", "noop");
    await a.next("offer");
    await a.ping();
    b.want("b-noop", "noop");
    b.want("b-sleep", "sleep");
    await b.ping();
    const ended = a.end();
    // The offer a can no longer answer moves on at once; the parked want never comes back.
    expect((await b.next("offer")).jobId).to.equal("b-noop");
    const done = await a.next("done", 10_000);
    expect(done.jobId).to.equal("run");
    expect(done.receipt?.exitCode).to.equal(0);
    const status = await ended;
    expect(status.code).to.equal(0);
    expect(a.received.at(-1)?.frame.case).to.equal("done");
    expect(a.unconsumed("offer")).to.deep.equal([]);
    expect((await b.next("offer")).jobId).to.equal("b-sleep");
    await eventually(() => expect(server.status().connections).to.have.length(1));
  });

  it("a half-close with nothing running ends the stream at once", async () => {
    const server = await startTestServer();
    const a = await BrokerStream.open(server.grpcAddress);
    a.want("p", "sleep");
    a.want("q", "sleep");
    await a.ping();
    expect((await a.end()).code).to.equal(0);
    await eventually(() => expect(server.status().waitgroups.find((w) => w.name === "slow")!.offered).to.equal(0));
    expect(server.status().waitgroups.find((w) => w.name === "slow")!.waiting).to.equal(0n);
  });

  it("gives a declined slot to the next want at once", async () => {
    const server = await startTestServer();
    const a = await BrokerStream.open(server.grpcAddress);
    const b = await BrokerStream.open(server.grpcAddress);
    a.want("x", "noop");
    const offer = await a.next("offer");
    b.want("y", "noop");
    await b.ping();
    a.decline("x", offer.offerToken);
    expect((await b.next("offer")).jobId).to.equal("y");
    // The declined want is gone: a JOB for it is stale.
    a.job("x", offer.offerToken);
    expect((await a.next("reject")).code).to.equal(RejectCode.STALE_OFFER);
  });

  it("a DECLINE of an offer made at once on a free slot ends the connection's turn: a sibling's want is offered before its own next one", async () => {
    const server = await startTestServer();
    const a = await BrokerStream.open(server.grpcAddress);
    const b = await BrokerStream.open(server.grpcAddress);
    a.want("a1", "noop");
    const offer = await a.next("offer");
    // a parks first, so a's queue holds the round-robin cursor when the slot frees.
    a.want("a2", "noop");
    await a.ping();
    b.want("b1", "noop");
    await b.ping();
    a.decline("a1", offer.offerToken);
    expect((await b.next("offer")).jobId).to.equal("b1");
    await a.ping();
    expect(a.unconsumed("offer")).to.deep.equal([]);
  });

  it("a DECLINE of an offer that came from the book ends the connection's turn the same way", async () => {
    const server = await startTestServer();
    const holder = await BrokerStream.open(server.grpcAddress);
    holder.want("hold", "noop");
    const held = await holder.next("offer");
    const a = await BrokerStream.open(server.grpcAddress);
    const b = await BrokerStream.open(server.grpcAddress);
    a.want("a1", "noop");
    a.want("a2", "noop");
    await a.ping();
    b.want("b1", "noop");
    await b.ping();
    holder.decline("hold", held.offerToken);
    const offer = await a.next("offer");
    expect(offer.jobId).to.equal("a1");
    a.decline("a1", offer.offerToken);
    expect((await b.next("offer")).jobId).to.equal("b1");
    await a.ping();
    expect(a.unconsumed("offer")).to.deep.equal([]);
  });

  it("withdraws an offered want on UNWANT and offers the slot on", async () => {
    const server = await startTestServer();
    const a = await BrokerStream.open(server.grpcAddress);
    const b = await BrokerStream.open(server.grpcAddress);
    a.want("x", "noop");
    await a.next("offer");
    b.want("y", "noop");
    await b.ping();
    a.unwant("x");
    expect((await b.next("offer")).jobId).to.equal("y");
  });

  it("forgets a dropped connection's wants and passes its offered slot on", async () => {
    const server = await startTestServer();
    const a = await BrokerStream.open(server.grpcAddress);
    const b = await BrokerStream.open(server.grpcAddress);
    a.want("a1", "noop");
    await a.next("offer");
    for (let i = 2; i <= 50; i++) a.want(`a${i}`, "noop");
    await a.ping();
    b.want("b1", "noop");
    await b.ping();
    expect(server.status().waitgroups.find((w) => w.name === "one")!.waiting).to.equal(50n);
    await a.close();
    expect((await b.next("offer")).jobId).to.equal("b1");
    const one = server.status().waitgroups.find((w) => w.name === "one")!;
    expect(one.waiting).to.equal(0n);
    expect(one.offered).to.equal(1);
    expect(server.status().connections).to.have.length(1);
  });

  it("cancels a dropped connection's running job", async () => {
    const server = await startTestServer();
    const a = await BrokerStream.open(server.grpcAddress);
    a.want("nap", "sleep");
    const offer = await a.next("offer");
    a.job("nap", offer.offerToken, { args: ["30"] });
    await eventually(() => expect(server.status().waitgroups.find((w) => w.name === "slow")!.running).to.equal(1));
    await a.close();
    await eventually(() => expect(server.status().waitgroups.find((w) => w.name === "slow")!.running).to.equal(0), 10_000);
  });

  it("answers QUERY with the position the grant rule gives", async () => {
    const server = await startTestServer();
    const holder = await BrokerStream.open(server.grpcAddress);
    holder.want("hold", "noop");
    const held = await holder.next("offer");
    const a = await BrokerStream.open(server.grpcAddress);
    const b = await BrokerStream.open(server.grpcAddress);
    a.want("a1", "noop");
    a.want("a2", "noop");
    await a.ping();
    b.want("b1", "noop");
    await b.ping();
    a.query("a2");
    const position = await a.next("position");
    expect(position).to.include({ jobId: "a2", state: PositionState.PARKED, ahead: 2, capacity: 1, running: 0, waitgroup: "one" });
    holder.query("hold");
    expect((await holder.next("position")).state).to.equal(PositionState.OFFERED);
    holder.job("hold", held.offerToken);
    await holder.next("done");
    holder.query("hold");
    expect((await holder.next("position")).state).to.equal(PositionState.UNSPECIFIED);
    // a1 took the freed slot and the round-robin turn passed to b: b1 is next.
    expect((await a.next("offer")).jobId).to.equal("a1");
    b.query("b1");
    const bPosition = await b.next("position");
    expect(bPosition.ahead).to.equal(0);
    // With one job of history there is an ETA.
    expect(bPosition.eta).to.not.equal(undefined);
  });

  it("reports a cancelled job in DONE when the runner is aborted by the drain timeout", async () => {
    const server = await startTestServer({ drainTimeout: "100ms" });
    const a = await BrokerStream.open(server.grpcAddress);
    a.want("nap", "sleep");
    const offer = await a.next("offer");
    a.job("nap", offer.offerToken, { args: ["30"] });
    await eventually(() => expect(server.status().waitgroups.find((w) => w.name === "slow")!.running).to.equal(1));
    const closed = server.close();
    const done = await a.next("done", 15_000);
    expect(done.receipt?.error).to.equal(ErrorKind.CANCELLED);
    await closed;
    expect(server.state).to.equal("stopped");
  });

  it("counts offers, grants, declines and the client name per connection in GetStatus", async () => {
    const server = await startTestServer();
    const a = await BrokerStream.open(server.grpcAddress, { clientName: "fylr-a" });
    a.want("x", "noop2");
    const x = await a.next("offer");
    a.want("y", "noop2");
    const y = await a.next("offer");
    a.decline("x", x.offerToken);
    a.job("y", y.offerToken);
    await a.next("done");
    a.want("z", "nope");
    await a.next("reject");
    const status = await statusClient(server.grpcAddress).getStatus();
    const c = status.connections[0]!;
    expect(c).to.include({ clientName: "fylr-a", offers: 2n, grants: 1n, declines: 1n, rejects: 1n, done: 1n, running: 0, wantsParked: 0n });
    expect(c.peerAddress).to.match(/^127\.0\.0\.1:\d+$/);
    const two = status.waitgroups.find((w) => w.name === "two")!;
    expect(two).to.include({ processes: 2, running: 0, offered: 0, free: 2, completed: 1n });
    expect(status.services).to.deep.equal({ noop: "one", noop2: "two", sleep: "slow" });
  });
});
