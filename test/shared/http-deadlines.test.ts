// BodyDeadlines on a keep-alive HTTP/1.1 connection: small bodies that come with their
// headers cost the connection nothing that outlives the request, and a slow body is still
// cut (the whole picture, every listener, is test/reliability/slow-bodies.test.ts).
import { expect } from "chai";
import { createServer, request, Agent, type Server, type IncomingMessage } from "node:http";
import { connect, type AddressInfo } from "node:net";
import { BodyDeadlines } from "../../src/shared/http-deadlines.js";

function post(port: number, agent: Agent, body: string): Promise<string> {
  return new Promise((resolve, reject) => {
    const req = request({ port, host: "127.0.0.1", method: "POST", agent, headers: { "content-type": "application/json" } }, (res) => {
      const chunks: Buffer[] = [];
      res.on("data", (c: Buffer) => chunks.push(c));
      res.on("end", () => resolve(Buffer.concat(chunks).toString()));
    });
    req.on("error", reject);
    req.end(body);
  });
}

describe("BodyDeadlines", () => {
  let server: Server;
  let port: number;
  const closeListeners: number[] = [];

  before(async () => {
    const bodies = new BodyDeadlines({ bodyTimeoutMs: 300, bodyMinRate: 0 });
    server = createServer((req: IncomingMessage, res) => {
      bodies.watch(req, res);
      const chunks: Buffer[] = [];
      req.on("data", (c: Buffer) => chunks.push(c));
      req.on("end", () => {
        closeListeners.push(req.socket.listenerCount("close"));
        res.end(Buffer.concat(chunks));
      });
    });
    await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
    port = (server.address() as AddressInfo).port;
  });

  after(() => {
    server.closeAllConnections();
    server.close();
  });

  it("adds nothing per request to a keep-alive connection whose small bodies come whole", async () => {
    const agent = new Agent({ keepAlive: true, maxSockets: 1 });
    try {
      closeListeners.length = 0;
      // Well within one tick of the body deadline's timer: a watcher per request would pile up.
      for (let i = 0; i < 50; i++) expect(await post(port, agent, JSON.stringify({ i }))).to.equal(JSON.stringify({ i }));
      expect(closeListeners).to.have.length(50);
      expect(Math.max(...closeListeners)).to.equal(closeListeners[0]);
    } finally {
      agent.destroy();
    }
  });

  it("adds nothing per request to a keep-alive connection whose bodies come after their headers", async () => {
    closeListeners.length = 0;
    const socket = connect(port, "127.0.0.1");
    try {
      let text = "";
      socket.on("data", (d: Buffer) => (text += d.toString()));
      for (let i = 0; i < 15; i++) {
        const body = JSON.stringify({ i });
        socket.write(`POST / HTTP/1.1\r\nhost: x\r\ncontent-length: ${body.length}\r\n\r\n`);
        // Later than the turn the deadline waits for, so every body is timed.
        await new Promise((resolve) => setTimeout(resolve, 5));
        socket.write(body);
        while (!text.endsWith(body)) await new Promise((resolve) => setTimeout(resolve, 1));
      }
      expect(closeListeners).to.have.length(15);
      expect(Math.max(...closeListeners)).to.equal(closeListeners[0]);
    } finally {
      socket.destroy();
    }
  });

  it("still cuts a body that stalls after its headers", async () => {
    const socket = connect(port, "127.0.0.1");
    const answer = new Promise<string>((resolve) => {
      let text = "";
      socket.on("data", (d: Buffer) => (text += d.toString()));
      socket.on("close", () => resolve(text));
    });
    socket.write("POST / HTTP/1.1\r\nhost: x\r\ncontent-length: 10\r\n\r\nabc");
    const started = Date.now();
    expect(await answer).to.match(/^HTTP\/1\.1 408 /);
    expect(Date.now() - started).to.be.within(250, 5_000);
  });
});
