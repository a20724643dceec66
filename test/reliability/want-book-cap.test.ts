// Finding 6 of the trust review, with a real execserver process: a server-wide cap on
// parked wants (maxWantsTotal) next to the per-connection one, with its own reject code.
import { expect } from "chai";
import { RejectCode } from "../../gen/slotbroker/v1/broker_pb.js";
import { BrokerStream, releaseAll } from "../execserver/support/broker-stream.js";
import { spawnExecserver, type ExecserverProcess } from "../../harness/execserver-process.js";
import { release } from "../../harness/resources.js";

describe("reliability: the want-book has a server-wide cap", () => {
  let exec: ExecserverProcess | undefined;
  afterEach(async () => {
    await releaseAll();
    await release(exec);
    exec = undefined;
  });

  it("finding 6: wants past maxWantsTotal over all connections are rejected with BOOK_FULL; room frees as wants leave", async function () {
    this.timeout(60_000);
    exec = await spawnExecserver({
      instanceId: "exec-book",
      maxWantsPerConnection: 20,
      maxWantsTotal: 30,
      waitgroups: { w: { processes: 1 } },
      services: { sleep: { waitgroup: "w", command: ["sleep"] } },
    });
    const a = await BrokerStream.open(exec.grpcAddress, { clientName: "a" });
    const b = await BrokerStream.open(exec.grpcAddress, { clientName: "b" });
    // The first want takes the one slot (an offer, not parked); 20 park; 4 hit the per-connection cap.
    for (let i = 0; i < 25; i++) a.want(`a${i}`, "sleep");
    await a.ping();
    const aRejects = a.unconsumed("reject");
    expect(aRejects.map((r) => r.code)).to.deep.equal(Array(4).fill(RejectCode.RESOURCE_EXHAUSTED));
    // b parks 10 (30 in the book), then the book is full.
    for (let i = 0; i < 15; i++) b.want(`b${i}`, "sleep");
    await b.ping();
    const bRejects = b.unconsumed("reject");
    expect(bRejects.map((r) => r.code)).to.deep.equal(Array(5).fill(RejectCode.BOOK_FULL));
    expect(bRejects[0]!.message).to.match(/want-book is full \(30 wants parked, maxWantsTotal 30\)/);
    expect(bRejects.map((r) => r.jobId)).to.deep.equal(["b10", "b11", "b12", "b13", "b14"]);
    // a leaves: its parked wants vanish, and b parks again.
    await a.close();
    b.want("b-again", "sleep");
    await b.ping();
    expect(b.unconsumed("reject")).to.have.length(5);
    const status = await exec.status();
    expect(status.connections.map((c) => Number(c.wantsParked))).to.include(10);
  });
});
