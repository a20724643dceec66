import { expect } from "chai";
import { execFileSync } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import * as grpc from "@grpc/grpc-js";
import { BrokerStream, releaseAll } from "./support/broker-stream.js";
import { startTestServer } from "./support/server.js";
import { requireTool } from "../support/system-tools.js";

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

  it("names the TLS key whose file cannot be read", async () => {
    const error = await startTestServer({ tls: { certFile: join(dir, "missing.crt"), keyFile: server.key } }).catch((e: unknown) => e);
    expect((error as Error).message).to.match(/^tls\.certFile: cannot read/);
  });
});
