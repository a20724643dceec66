// What docs/protocol.md promises about the order of frames: a client may send WANT before
// it has read HELLO, and DONE for a job with a streamed stdout comes only after the stdout
// PUT was answered.
import { createServer, type IncomingMessage, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { expect } from "chai";
import { RejectCode } from "../../gen/slotbroker/v1/broker_pb.js";
import { BrokerStream, releaseAll } from "./support/broker-stream.js";
import { startTestServer } from "./support/server.js";

describe("execserver frame order", () => {
  let pipeServer: Server | undefined;
  afterEach(async () => {
    await releaseAll();
    if (pipeServer) await new Promise((resolve) => pipeServer!.close(resolve));
    pipeServer = undefined;
  });

  it("serves WANTs sent before the client read HELLO: HELLO still comes first, then the OFFER or the Reject", async () => {
    const server = await startTestServer();
    const a = await BrokerStream.open(server.grpcAddress, { awaitHello: false });
    // Sent at once, on a stream whose HELLO has not arrived yet.
    a.want("early", "noop");
    a.want("unknown", "no-such-service");
    const offer = await a.next("offer");
    expect(offer.jobId).to.equal("early");
    const reject = await a.next("reject");
    expect([reject.jobId, reject.code]).to.deep.equal(["unknown", RejectCode.UNKNOWN_SERVICE]);
    expect(a.received.map((f) => f.frame.case)).to.deep.equal(["hello", "offer", "reject"]);
  });

  it("sends DONE only after the stdout PUT was answered", async () => {
    const server = await startTestServer({
      waitgroups: { w: { processes: 1 } },
      services: { big: { waitgroup: "w", command: ["sh", "-c", "head -c 10000 /dev/zero"] } },
    });
    // A pipe server that reads the whole body, then holds its answer for 500 ms.
    let answeredAt = 0;
    let received = 0;
    pipeServer = createServer((req: IncomingMessage, res) => {
      req.on("data", (chunk: Buffer) => (received += chunk.length));
      req.on("end", () =>
        setTimeout(() => {
          answeredAt = performance.now();
          res.writeHead(204).end();
        }, 500),
      );
    });
    await new Promise<void>((resolve) => pipeServer!.listen(0, "127.0.0.1", resolve));
    const port = (pipeServer.address() as AddressInfo).port;
    const a = await BrokerStream.open(server.grpcAddress);
    a.want("j", "big");
    a.job("j", (await a.next("offer")).offerToken, { stdoutUrl: `http://127.0.0.1:${port}/out` });
    const done = await a.next("done", 10_000);
    const doneAt = performance.now();
    expect(done.receipt?.exitCode).to.equal(0);
    expect(done.receipt?.stdoutStreamed).to.equal(true);
    expect(received).to.equal(10_000);
    expect(answeredAt, "the PUT was answered").to.be.greaterThan(0);
    expect(doneAt).to.be.greaterThan(answeredAt);
  });
});
