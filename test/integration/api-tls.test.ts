// TLS on the fylr's HTTP port and client certificates as identities, end to end with
// certificates made by openssl for this run: a CA, the fylr's certificate for 127.0.0.1,
// client certificates (one mapped to admin, one to read) and a client certificate of
// another CA. Connect, gRPC (grpc-js, grpcurl), curl and the CLI as clients; execservers
// fetch the https pipe URLs with no certificate, trusting the CA through pipes.caFile.
import { expect } from "chai";
import { createHash } from "node:crypto";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { PassThrough } from "node:stream";
import { create } from "@bufbuild/protobuf";
import { Code, ConnectError } from "@connectrpc/connect";
import * as grpc from "@grpc/grpc-js";
import { ItemState, QueueService, StatsRequestSchema, SubmitRequestSchema, type Item } from "../../gen/slotbroker/v1/queue_pb.js";
import { createQueueClient, downloadOutput, followItem, type ApiCredentials } from "../../src/api/index.js";
import { grpcClientConstructor } from "../../src/shared/grpc.js";
import { makeCa, type CertFiles, type TestCa } from "../support/certificates.js";
import { spawnExecserver, waitFor, type ExecserverProcess } from "../../harness/execserver-process.js";
import { createTestDatabase } from "../support/postgres.js";
import { requireTool } from "../../harness/system-tools.js";
import { run } from "../support/run-program.js";
import { closeAll, fastFylrConfig, slotbroker, spawnFylr, type FylrProcess } from "./support.js";

const ciToken = "ci-token-5e4d3c2b1a0f9e8d";
// Past the execserver's 4000-byte buffer: the job's stdout goes to the fylr's https out-pipe.
const input = Buffer.alloc(50_000, "tls pipe bytes\n");

describe("the fylr over TLS with client certificates", function () {
  this.timeout(120_000);
  let dir: string;
  let ca: TestCa;
  let ops: CertFiles;
  let reader: CertFiles;
  let rogue: CertFiles;
  let trusting: ExecserverProcess;
  let untrusting: ExecserverProcess;
  let fylr: FylrProcess;
  let address: string;

  const creds = (client?: CertFiles, extra: ApiCredentials = {}): ApiCredentials => ({
    ca: readFileSync(ca.cert),
    ...(client && { cert: readFileSync(client.cert), key: readFileSync(client.key) }),
    ...extra,
  });

  before(async function () {
    this.timeout(180_000);
    dir = mkdtempSync(join(tmpdir(), "slotbroker-tls-"));
    ca = makeCa(dir, "test-ca");
    const server = ca.server("fylr");
    ops = ca.client("ops-client");
    reader = ca.sign("reader-client", "extendedKeyUsage=clientAuth\nsubjectAltName=URI:spiffe://test/reader\n");
    rogue = makeCa(dir, "other-ca").sign("ops-client-rogue", "extendedKeyUsage=clientAuth\nsubjectAltName=DNS:ops-client\n");
    const services = (name: string): Record<string, { waitgroup: string; command: string[] }> => ({ [name]: { waitgroup: "text", command: ["cat"] } });
    trusting = await spawnExecserver({ waitgroups: { text: { processes: 2 } }, services: services("cat"), pipes: { caFile: ca.cert } });
    untrusting = await spawnExecserver({ waitgroups: { text: { processes: 2 } }, services: services("cat-untrusting") });
    const config = fastFylrConfig(await createTestDatabase("tls"), [trusting.grpcAddress, untrusting.grpcAddress], {
      tls: { certFile: server.cert, keyFile: server.key, clientCaFile: ca.cert },
      auth: {
        tokens: [{ name: "ci", token: ciToken, scopes: ["submit", "read"] }],
        clients: [
          { subject: "ops-client", scopes: ["admin"] },
          { subject: "spiffe://test/reader", scopes: ["read"] },
        ],
      },
    });
    fylr = await spawnFylr(config, "tls", { credentials: creds(ops) });
    address = fylr.url.replace(/^https:\/\//, "");
    // The fylr listens before its streams are up; a Submit for `cat` needs the trusting one.
    for (const exec of [trusting, untrusting]) await waitFor("the fylr connected", async () => (await exec.status()).connections.length >= 1);
  });

  after(async () => {
    await closeAll(fylr, trusting, untrusting);
    if (dir) rmSync(dir, { recursive: true, force: true });
  });

  it("serves https: a client certificate mapped to admin submits; the job's pipes are https, fetched with no certificate", async () => {
    expect(fylr.url).to.match(/^https:\/\/127\.0\.0\.1:\d+$/);
    const client = createQueueClient(fylr.url, creds(ops));
    const { item } = await client.submit({ calls: [{ service: "cat", stdin: { case: "stdinData", value: input } }], maxAttempts: 1 });
    const done = await followItem(client, item!.id);
    expect(done.state, done.error).to.equal(ItemState.SUCCEEDED);
    expect(done.outputSize).to.equal(BigInt(input.length));
    const sink = new PassThrough();
    const chunks: Buffer[] = [];
    sink.on("data", (c: Buffer) => chunks.push(c));
    const got = await downloadOutput(fylr.url, done.id, sink, { credentials: creds(ops) });
    expect(got.sha256).to.equal(createHash("sha256").update(input).digest("hex"));
    expect(Buffer.concat(chunks).equals(input)).to.equal(true);
    // Retry needs admin: an answer about the item, not about the caller.
    const retry = await client.retry({ id: done.id }).then(() => undefined, (err: unknown) => ConnectError.from(err));
    expect(retry?.code).to.equal(Code.FailedPrecondition);
  });

  it("an execserver without pipes.caFile cannot verify the fylr: the job fails with a pipe error naming the certificate", async () => {
    const client = createQueueClient(fylr.url, creds(ops));
    const { item } = await client.submit({ calls: [{ service: "cat-untrusting", stdin: { case: "stdinData", value: input } }], maxAttempts: 1 });
    const done: Item = await followItem(client, item!.id);
    expect(done.state).to.equal(ItemState.FAILED);
    expect(done.error).to.match(/stdout upload failed: .*(certificate|CERT)/i);
  });

  it("over Connect: no certificate and no token, or a certificate of another CA, is UNAUTHENTICATED; a token still works; a read certificate may not submit", async () => {
    const submit = async (credentials: ApiCredentials): Promise<ConnectError | undefined> =>
      createQueueClient(fylr.url, credentials)
        .submit({ calls: [{ service: "cat", stdin: { case: "stdinData", value: Buffer.from("x") } }] })
        .then(() => undefined, (err: unknown) => ConnectError.from(err));
    const anonymous = await submit(creds());
    expect(anonymous?.code).to.equal(Code.Unauthenticated);
    expect(anonymous?.rawMessage).to.match(/^no credential/);
    const other = await submit(creds(rogue));
    expect(other?.code).to.equal(Code.Unauthenticated);
    expect(other?.rawMessage).to.match(/^client certificate CN=ops-client-rogue was not accepted \(/);
    expect(await submit(creds(undefined, { token: ciToken }))).to.equal(undefined);
    const readOnly = await submit(creds(reader));
    expect(readOnly?.code).to.equal(Code.PermissionDenied);
    expect(readOnly?.rawMessage).to.equal("client certificate spiffe://test/reader has read; this call needs the submit scope");
    await createQueueClient(fylr.url, creds(reader)).stats({});
  });

  it("over gRPC (grpc-js, TLS with ALPN h2): a mapped certificate is served, none or another CA's is UNAUTHENTICATED", async () => {
    const Client = grpcClientConstructor(QueueService);
    const call = async (credentials: grpc.ChannelCredentials, method: "stats" | "submit"): Promise<grpc.status> => {
      // By name: grpc-js would send an IP address as the TLS server name (Node warns).
      const client = new Client(address.replace("127.0.0.1", "localhost"), credentials) as unknown as Record<string, (r: unknown, cb: (err: grpc.ServiceError | null) => void) => void>;
      try {
        const request =
          method === "stats" ? create(StatsRequestSchema) : create(SubmitRequestSchema, { calls: [{ service: "cat", stdin: { case: "stdinData", value: Buffer.from("x") } }] });
        return await new Promise((resolve) => client[method]!.call(client, request, (err) => resolve(err ? err.code : grpc.status.OK)));
      } finally {
        (client as unknown as grpc.Client).close();
      }
    };
    const caCertFiles = readFileSync(ca.cert);
    const withCert = (pem: CertFiles): grpc.ChannelCredentials => grpc.credentials.createSsl(caCertFiles, readFileSync(pem.key), readFileSync(pem.cert));
    expect(await call(withCert(ops), "submit")).to.equal(grpc.status.OK);
    expect(await call(withCert(reader), "stats")).to.equal(grpc.status.OK);
    expect(await call(withCert(reader), "submit")).to.equal(grpc.status.PERMISSION_DENIED);
    expect(await call(grpc.credentials.createSsl(caCertFiles), "stats")).to.equal(grpc.status.UNAUTHENTICATED);
    expect(await call(withCert(rogue), "stats")).to.equal(grpc.status.UNAUTHENTICATED);
  });

  it("curl over HTTP/2 and HTTP/1.1: the certificate is the credential; no certificate or another CA's gets 401; cleartext gets nothing", async () => {
    const curl = requireTool("curl");
    const get = async (args: string[]): Promise<string> => (await run(curl, ["-s", "-o", "/dev/null", "-w", "%{http_code} %{http_version}", "--cacert", ca.cert, ...args])).stdout;
    expect(await get(["--cert", ops.cert, "--key", ops.key, `${fylr.url}/status.json`])).to.equal("200 2");
    expect(await get(["--http1.1", "--cert", ops.cert, "--key", ops.key, `${fylr.url}/status.json`])).to.equal("200 1.1");
    expect(await get([`${fylr.url}/status.json`])).to.equal("401 2");
    expect(await get(["--cert", rogue.cert, "--key", rogue.key, `${fylr.url}/status.json`])).to.equal("401 2");
    expect(await get(["-H", `authorization: Bearer ${ciToken}`, `${fylr.url}/status.json`])).to.equal("200 2");
    expect(await get([`${fylr.url}/healthz`])).to.equal("200 2");
    const cleartext = await run(curl, ["-s", "-o", "/dev/null", "-w", "%{http_code}", `http://${address}/healthz`]);
    expect(cleartext.stdout).to.equal("000");
  });

  it("the CLI takes --ca, --cert and --key (or SLOTBROKER_API_CA/CERT/KEY)", async () => {
    const env = { SLOTBROKER_API: fylr.url, SLOTBROKER_API_TOKEN: "" };
    const submitted = await slotbroker(["submit", "--service", "cat", "--stdin", "-", "--wait", "--ca", ca.cert, "--cert", ops.cert, "--key", ops.key], {
      env,
      input: "over tls\n",
    });
    expect(submitted.code, submitted.stderr).to.equal(0);
    expect(submitted.stdout.toString()).to.equal("over tls\n");
    const listed = await slotbroker(["list", "--limit", "1"], { env: { ...env, SLOTBROKER_API_CA: ca.cert, SLOTBROKER_API_CERT: reader.cert, SLOTBROKER_API_KEY: reader.key } });
    expect(listed.code, listed.stderr).to.equal(0);
    const anonymous = await slotbroker(["list"], { env: { ...env, SLOTBROKER_API_CA: ca.cert } });
    expect(anonymous.code).to.equal(1);
    expect(anonymous.stderr).to.include("answered 401 unauthenticated: no credential");
  });
});
