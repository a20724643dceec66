// The execserver's gRPC port, with a real process: a connection that never completes its
// TLS handshake or its HTTP/2 preface is cut after `handshakeTimeout`, however slowly it
// trickles, while real gRPC clients (cleartext, TLS and mTLS) keep being served.
import { execFileSync } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { connect, type Socket } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import * as tls from "node:tls";
import * as grpc from "@grpc/grpc-js";
import { expect } from "chai";
import { BrokerStream, releaseAll } from "../execserver/support/broker-stream.js";
import { spawnExecserver, type ExecserverProcess } from "../../harness/execserver-process.js";
import { release } from "../../harness/resources.js";
import { requireTool } from "../../harness/system-tools.js";
import { prefaceProgress } from "../../src/execserver/grpc-door.js";

const services = { echo: { waitgroup: "w", command: ["echo"] } };
const waitgroups = { w: { processes: 1 } };
const PREFACE = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/** When `socket` closed, in ms after `since`; rejects if still open after `ms`. */
function closedAt(socket: Socket, since: number, ms: number, what: string): Promise<number> {
  return new Promise((resolve, reject) => {
    if (socket.destroyed) return resolve(Date.now() - since);
    const timer = setTimeout(() => reject(new Error(`${what} was still open after ${ms} ms`)), ms);
    socket.once("close", () => {
      clearTimeout(timer);
      resolve(Date.now() - since);
    });
  });
}

function tcp(address: string): Promise<Socket> {
  const [host, port] = address.split(":") as [string, string];
  return new Promise((resolve, reject) => {
    const s = connect(Number(port), host, () => resolve(s));
    s.once("error", reject);
  });
}

/** One want → offer → job → done on a real gRPC stream. */
async function runOne(address: string, id: string, credentials?: grpc.ChannelCredentials): Promise<void> {
  const stream = await BrokerStream.open(address, credentials ? { credentials } : {});
  stream.want(id, "echo");
  stream.job(id, (await stream.next("offer")).offerToken, { args: [id] });
  expect((await stream.next("done", 10_000)).receipt?.exitCode).to.equal(0);
}

describe("reliability: the execserver's gRPC port cuts unfinished handshakes", () => {
  let exec: ExecserverProcess | undefined;
  const sockets: Socket[] = [];
  afterEach(async () => {
    for (const s of sockets.splice(0)) s.destroy();
    await releaseAll();
    await release(exec);
    exec = undefined;
  });

  it("reads the preface and the first frame before it hands a connection on", () => {
    const settings = Buffer.from([0, 0, 6, 4, 0, 0, 0, 0, 0, 0, 3, 0, 0, 0, 100]);
    const full = Buffer.concat([Buffer.from(PREFACE, "latin1"), settings]);
    expect(prefaceProgress(full.subarray(0, 10))).to.equal("partial");
    expect(prefaceProgress(full.subarray(0, 30))).to.equal("partial");
    expect(prefaceProgress(full.subarray(0, full.length - 1))).to.equal("partial");
    expect(prefaceProgress(full)).to.equal("complete");
    expect(prefaceProgress(Buffer.from("GET / HTTP/1.1\r\n"))).to.equal("other");
    expect(prefaceProgress(Buffer.concat([Buffer.from(PREFACE, "latin1"), Buffer.from([0xff, 0xff, 0xff, 4, 0, 0, 0, 0, 0])]))).to.equal("other");
  });

  it("cuts half prefaces, trickled prefaces and silent connections after handshakeTimeout; gRPC clients go on", async function () {
    this.timeout(30_000);
    exec = await spawnExecserver({ waitgroups, services, handshakeTimeout: "1s" });
    const since = Date.now();
    const half = await Promise.all(Array.from({ length: 20 }, () => tcp(exec!.grpcAddress)));
    for (const s of half) s.write(PREFACE.slice(0, 12));
    const silent = await Promise.all(Array.from({ length: 5 }, () => tcp(exec!.grpcAddress)));
    // A byte every 100 ms: an idle timer reset by each byte would never fire.
    const trickle = await tcp(exec.grpcAddress);
    sockets.push(...half, ...silent, trickle);
    let i = 0;
    const drip = setInterval(() => {
      if (!trickle.destroyed && i < PREFACE.length) trickle.write(PREFACE[i++]!);
    }, 100);
    try {
      const closed = Promise.all([...half, ...silent, trickle].map((s, n) => closedAt(s, since, 6_000, `connection ${n}`)));
      // Meanwhile real clients connect and run jobs.
      await runOne(exec.grpcAddress, "during-1");
      await runOne(exec.grpcAddress, "during-2");
      const times = await closed;
      expect(Math.min(...times)).to.be.greaterThan(800);
    } finally {
      clearInterval(drip);
    }
    await runOne(exec.grpcAddress, "after");
  });

  describe("with TLS and client certificates", () => {
    let dir: string;
    const files = (name: string): { cert: string; key: string } => ({ cert: join(dir, `${name}.crt`), key: join(dir, `${name}.key`) });
    before(() => {
      dir = mkdtempSync(join(tmpdir(), "grpc-handshake-"));
      for (const name of ["server", "client", "stranger"]) {
        const { cert, key } = files(name);
        execFileSync(
          requireTool("openssl"),
          ["req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-days", "1", "-subj", `/CN=${name}`,
            "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost", "-keyout", key, "-out", cert],
          { stdio: "ignore" },
        );
      }
    });
    after(() => dir && rmSync(dir, { recursive: true, force: true }));

    it("cuts a stalled TLS handshake and a half preface inside TLS; mTLS clients go on, strangers are refused", async function () {
      this.timeout(30_000);
      const server = files("server");
      const client = files("client");
      exec = await spawnExecserver({ waitgroups, services, handshakeTimeout: "1s", tls: { certFile: server.cert, keyFile: server.key, clientCaFile: client.cert } });
      const port = Number(exec.grpcAddress.split(":")[1]);
      const since = Date.now();
      // Half a ClientHello's worth of nothing: the TLS record header only.
      const stalled = await tcp(exec.grpcAddress);
      stalled.write(Buffer.from([0x16, 0x03, 0x01]));
      // A complete handshake with a client certificate, then half a preface.
      const inside = await new Promise<tls.TLSSocket>((resolve, reject) => {
        const s = tls.connect({ port, host: "127.0.0.1", ca: readFileSync(server.cert), cert: readFileSync(client.cert), key: readFileSync(client.key), ALPNProtocols: ["h2"], servername: "localhost" }, () => resolve(s));
        s.once("error", reject);
      });
      expect(inside.alpnProtocol).to.equal("h2");
      inside.write(PREFACE.slice(0, 12));
      sockets.push(stalled, inside);
      const closed = Promise.all([closedAt(stalled, since, 6_000, "the stalled handshake"), closedAt(inside, since, 6_000, "the half preface inside TLS")]);
      const ca = readFileSync(server.cert);
      await runOne(`localhost:${port}`, "mtls", grpc.credentials.createSsl(ca, readFileSync(client.key), readFileSync(client.cert)));
      for (const credentials of [grpc.credentials.createSsl(ca), grpc.credentials.createSsl(ca, readFileSync(files("stranger").key), readFileSync(files("stranger").cert))]) {
        const refused = await BrokerStream.open(`localhost:${port}`, { credentials, awaitHello: false });
        expect((await refused.ended).code).to.equal(grpc.status.UNAVAILABLE);
      }
      expect(Math.min(...(await closed))).to.be.greaterThan(800);
    });
  });
});
