import { expect } from "chai";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import * as net from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import * as tls from "node:tls";
import { makeCa, type CertFiles, type TestCa } from "../support/certificates.js";
import { awaitCondition, eventsOf } from "../support/event-monitor.js";
import { spawnExecserver, waitFor, type ExecserverProcess } from "../../harness/execserver-process.js";
import { startReplica, stopReplica, type FylrReplica } from "../support/fylr-replica.js";
import { release, track } from "../../harness/resources.js";

// The token protocol over https with mutual TLS: a legacy-only execserver (a real process)
// behind a TLS terminator that requires a client certificate, as old execservers were run.
// The fylr presents execserver.tls.certFile/keyFile on its broker attempt, on the HTTP
// probe that finds the old protocol, and on every token request.

/** A TLS terminator on a free loopback port that requires a client certificate signed by `ca`. */
async function startTlsTerminator(server: CertFiles, ca: string, backend: string): Promise<{ address: string }> {
  const [host, port] = [backend.slice(0, backend.lastIndexOf(":")), Number(backend.slice(backend.lastIndexOf(":") + 1))];
  const sockets = new Set<net.Socket>();
  const terminator = tls.createServer(
    { cert: readFileSync(server.cert), key: readFileSync(server.key), ca: readFileSync(ca), requestCert: true, rejectUnauthorized: true },
    (socket) => {
      const upstream = net.connect(port, host);
      for (const s of [socket, upstream]) {
        sockets.add(s);
        s.once("close", () => sockets.delete(s));
        s.on("error", () => undefined);
      }
      socket.pipe(upstream).pipe(socket);
    },
  );
  terminator.on("tlsClientError", () => undefined);
  await new Promise<void>((resolve) => terminator.listen(0, "127.0.0.1", resolve));
  return track({ terminator, address: `127.0.0.1:${(terminator.address() as net.AddressInfo).port}` }, "tls terminator", () => {
    for (const s of sockets) s.destroy();
    return new Promise<void>((resolve) => terminator.close(() => resolve()));
  });
}

describe("fylr polling over https with a client certificate", function () {
  this.timeout(60_000);
  let dir: string;
  let ca: TestCa;
  let exec: ExecserverProcess;
  let address: string;
  let terminator: { address: string };
  let replica: FylrReplica | undefined;

  before(() => {
    dir = mkdtempSync(join(tmpdir(), "slotbroker-polling-tls-"));
    ca = makeCa(dir, "legacy-ca");
  });
  after(() => dir && rmSync(dir, { recursive: true, force: true }));
  beforeEach(async () => {
    exec = await spawnExecserver({ instanceId: "old-exec", brokerService: false, waitgroups: { w: { processes: 1 } }, services: { cat: { waitgroup: "w", command: ["cat"] } } });
    terminator = await startTlsTerminator(ca.server("terminator"), ca.cert, exec.grpcAddress);
    address = terminator.address;
  });
  afterEach(async () => {
    await stopReplica(replica);
    replica = undefined;
    await release(terminator);
    await release(exec);
  });

  it("finds the token protocol behind the terminator and runs a job through it, presenting its certificate", async () => {
    const client = ca.client("fylr");
    replica = await startReplica(
      { addresses: [address], tls: { caFile: ca.cert, certFile: client.cert, keyFile: client.key }, polling: { interval: "200ms", reprobe: "5s" } },
      "polling-tls",
    );
    const broker = replica.broker;
    await awaitCondition("the pool to poll", [eventsOf(broker.events, "pool:transport")], () => broker.pools()[0]!.transport === "polling");
    expect(broker.pools()[0]!.endpoint!.url.protocol).to.equal("https:");
    const ran = await replica.exec.run({ service: "cat", stdin: Buffer.from("through https with a client certificate") });
    expect(ran).to.include({ transport: "polling", instanceId: "old-exec" });
    expect(ran.stdout!.toString()).to.equal("through https with a client certificate");
  });

  it("without a certificate the terminator refuses it: no fallback, and the pool says why", async () => {
    replica = await startReplica({ addresses: [address], tls: { caFile: ca.cert }, polling: { interval: "200ms", reprobe: "5s" } }, "polling-tls-anonymous");
    const pool = replica.broker.pools()[0]!;
    const problem = await waitFor("the pool's TLS diagnosis", () => pool.tlsProblem);
    expect(problem).to.match(new RegExp(`^the execserver at ${address} refused this fylr's TLS client certificate \\(.*\\): execserver\\.tls\\.certFile and keyFile`));
    expect(pool.transport).to.equal("broker");
  });
});
