import { expect } from "chai";
import { execFileSync } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import * as grpc from "@grpc/grpc-js";
import { create } from "@bufbuild/protobuf";
import { createClient } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";
import { BrokerService, ConnectRequestSchema, type ConnectRequest } from "../../gen/slotbroker/v1/broker_pb.js";
import { BrokerStream, releaseAll } from "./support/broker-stream.js";
import { startTestServer } from "./support/server.js";
import { requireTool } from "../../harness/system-tools.js";

// Self-signed certificates made with the openssl CLI for this run.
function selfSigned(dir: string, name: string): { cert: string; key: string } {
  const cert = join(dir, `${name}.crt`);
  const key = join(dir, `${name}.key`);
  execFileSync(
    requireTool("openssl"),
    ["req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-days", "1", "-subj", `/CN=${name}`,
      "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost", "-keyout", key, "-out", cert],
    { stdio: "ignore" },
  );
  return { cert, key };
}

describe("execserver TLS", () => {
  let dir: string;
  let server: { cert: string; key: string };
  let client: { cert: string; key: string };
  before(() => {
    requireTool("openssl"); // makes the certificates
    dir = mkdtempSync(join(tmpdir(), "execserver-tls-"));
    server = selfSigned(dir, "server");
    client = selfSigned(dir, "client");
  });
  after(() => dir && rmSync(dir, { recursive: true, force: true }));
  afterEach(releaseAll);

  it("serves over TLS and, with clientCaFile, requires a client certificate", async () => {
    const exec = await startTestServer({ tls: { certFile: server.cert, keyFile: server.key, clientCaFile: client.cert } });
    const ca = readFileSync(server.cert);
    const withCert = grpc.credentials.createSsl(ca, readFileSync(client.key), readFileSync(client.cert));
    const a = await BrokerStream.open(`localhost:${exec.grpcPort}`, { credentials: withCert });
    a.want("t", "noop");
    expect((await a.next("offer")).jobId).to.equal("t");

    const anonymous = await BrokerStream.open(`localhost:${exec.grpcPort}`, { credentials: grpc.credentials.createSsl(ca), awaitHello: false });
    expect((await anonymous.ended).code).to.equal(grpc.status.UNAVAILABLE);
    const plaintext = await BrokerStream.open(`localhost:${exec.grpcPort}`, { awaitHello: false });
    expect((await plaintext.ended).code).to.equal(grpc.status.UNAVAILABLE);
  });

  it("serves a connect-es client over mTLS with a token, as docs/clients.md shows for TypeScript", async () => {
    const exec = await startTestServer({ token: "ts-secret", tls: { certFile: server.cert, keyFile: server.key, clientCaFile: client.cert } });
    // The snippet of docs/clients.md, "TypeScript".
    const transport = createGrpcTransport({
      baseUrl: `https://localhost:${exec.grpcPort}`,
      nodeOptions: { ca: readFileSync(server.cert), cert: readFileSync(client.cert), key: readFileSync(client.key) },
      interceptors: [
        (next) => (req) => {
          req.header.set("authorization", "Bearer ts-secret");
          return next(req);
        },
      ],
    });
    const broker = createClient(BrokerService, transport);
    const outgoing = new Pushable<ConnectRequest>();
    const frames = broker.connect(outgoing)[Symbol.asyncIterator]();
    try {
      outgoing.push(create(ConnectRequestSchema, { frame: { case: "want", value: { jobId: "t", service: "noop" } } }));
      const seen: string[] = [];
      for (let next = await frames.next(); !next.done; next = await frames.next()) {
        const frame = next.value.frame;
        seen.push(frame.case ?? "");
        if (frame.case === "offer") outgoing.push(create(ConnectRequestSchema, { frame: { case: "job", value: { jobId: "t", offerToken: frame.value.offerToken } } }));
        if (frame.case === "done") break;
      }
      expect(seen).to.deep.equal(["hello", "offer", "done"]);
    } finally {
      outgoing.end();
      await frames.return?.();
    }
  });

  it("names the TLS key whose file cannot be read", async () => {
    const error = await startTestServer({ tls: { certFile: join(dir, "missing.crt"), keyFile: server.key } }).catch((e: unknown) => e);
    expect((error as Error).message).to.match(/^tls\.certFile: cannot read/);
  });
});

// An async iterable that yields what is pushed into it, until end().
class Pushable<T> implements AsyncIterable<T> {
  private readonly queue: T[] = [];
  private wake: (() => void) | undefined;
  private ended = false;
  push(value: T): void {
    this.queue.push(value);
    this.wake?.();
  }
  end(): void {
    this.ended = true;
    this.wake?.();
  }
  async *[Symbol.asyncIterator](): AsyncIterator<T> {
    for (;;) {
      const value = this.queue.shift();
      if (value !== undefined) yield value;
      else if (this.ended) return;
      else await new Promise<void>((resolve) => (this.wake = resolve));
    }
  }
}
