// Findings 4, 5 and 7 of the trust review, with real processes: what an execserver would
// refuse is refused at submit (naming the field), request bodies are capped, one job's
// oversize frame never takes down its siblings, slow or idle connections are closed and
// the connection count is capped, and NUL characters or bodies that are not protobuf are a
// 400, not a 500.
import * as http2 from "node:http2";
import { connect, type Socket } from "node:net";
import { create, fromBinary, toBinary } from "@bufbuild/protobuf";
import { ConnectError, Code } from "@connectrpc/connect";
import * as grpc from "@grpc/grpc-js";
import { expect } from "chai";
import type pg from "pg";
import { QueueService, SubmitRequestSchema, SubmitResponseSchema } from "../../gen/slotbroker/v1/queue_pb.js";
import { spawnExecserver, waitFor, type ExecserverProcess } from "../../harness/execserver-process.js";
import { startReplica, stopReplica } from "../support/fylr-replica.js";
import { createTestDatabase } from "../support/postgres.js";
import { closeAll, fastFylrConfig, openPool, spawnFylr, type FylrProcess } from "../integration/support.js";
import { curl, statusAndBody, tempDir } from "../fylr/pipes-support.js";
import { release } from "../../harness/resources.js";

async function submitError(fylr: FylrProcess, request: Parameters<FylrProcess["client"]["submit"]>[0]): Promise<ConnectError> {
  try {
    await fylr.client.submit(request);
  } catch (err) {
    return ConnectError.from(err);
  }
  throw new Error("the submit was accepted");
}

function openSocket(port: number): Promise<Socket> {
  return new Promise((resolve, reject) => {
    const socket = connect(port, "127.0.0.1", () => resolve(socket));
    socket.once("error", reject);
  });
}

/** Resolves when `what` closes; fails naming it if it is still open after `ms`. */
function closedWithin(emitter: NodeJS.EventEmitter, ms: number, what: string): Promise<void> {
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`${what} was still open after ${ms} ms`)), ms);
    emitter.once("close", () => {
      clearTimeout(timer);
      resolve();
    });
  });
}

describe("reliability: hostile input at the fylr's doors", () => {
  let databaseUrl: string;
  let pool: pg.Pool;
  let exec: ExecserverProcess | undefined;
  let fylr: FylrProcess | undefined;
  const sockets: Socket[] = [];

  // One execserver for the file (no test leaves a job behind: the fylr's close ends them);
  // each test gets its own fylr and empty tables.
  before(async () => {
    databaseUrl = await createTestDatabase("hostile_input");
    exec = await spawnExecserver({
      instanceId: "exec-hostile",
      waitgroups: { w: { processes: 4 } },
      services: {
        echo: { waitgroup: "w", command: ["echo"] },
        sleep: { waitgroup: "w", command: ["sleep"] },
        envy: { waitgroup: "w", command: ["env"], env: ["FOO"] },
      },
    });
  });
  after(async () => {
    await closeAll(exec);
    exec = undefined;
  });
  beforeEach(async () => {
    pool = openPool(databaseUrl);
    // The first fylr migrates; later tests start from empty tables.
    await pool.query("DO $$ BEGIN IF to_regclass('queue_items') IS NOT NULL THEN TRUNCATE queue_items, fylrs CASCADE; END IF; END $$");
  });
  afterEach(async () => {
    for (const s of sockets.splice(0)) s.destroy();
    await closeAll(fylr, pool);
    fylr = undefined;
  });

  const start = async (extra: Parameters<typeof fastFylrConfig>[2] = {}): Promise<FylrProcess> =>
    (fylr = await spawnFylr(fastFylrConfig(databaseUrl, [exec!.grpcAddress], extra), "f-hostile"));

  it("finding 4: an argument over the execserver's limit is refused at submit, naming the field", async function () {
    this.timeout(60_000);
    await start();
    const err = await submitError(fylr!, { calls: [{ service: "echo", args: ["x".repeat(2_000_000)] }] });
    expect(err.code).to.equal(Code.InvalidArgument);
    expect(err.rawMessage).to.match(/^calls\[0\]\.args: 2000000 bytes, more than 262144/);
    const many = await submitError(fylr!, { calls: [{ service: "echo", args: Array.from({ length: 5000 }, () => "a") }] });
    expect(many.rawMessage).to.match(/^calls\[0\]\.args: more than 4096 entries/);
  });

  it("finding 4: an env name the service does not allow is refused at submit, naming it and the allowed ones", async function () {
    this.timeout(60_000);
    await start();
    // Until the fylr has the execserver's HELLO, any service goes; then unknown ones are refused.
    await waitFor("the fylr to know the execserver's services", async () => /no connected execserver offers/.test((await submitError(fylr!, { calls: [{ service: "nope" }] })).rawMessage));
    const err = await submitError(fylr!, { calls: [{ service: "echo" }, { service: "envy", env: { FOO: "1", BAR: "2" } }] });
    expect(err.code).to.equal(Code.InvalidArgument);
    expect(err.rawMessage).to.equal('calls[1].env: "BAR" is not allowed for service envy (allowed: FOO)');
    const ok = await fylr!.client.submit({ calls: [{ service: "envy", env: { FOO: "1" } }] });
    expect(ok.created).to.equal(true);
  });

  it("finding 4: a QueueService request body over http.maxRequestBytes is refused before it is parsed, with 413", async function () {
    this.timeout(60_000);
    // The default limit (16 MiB) and a 20 MB body, as curl and fetch send it.
    await start();
    const body = JSON.stringify({ calls: [{ service: "echo", stdinData: Buffer.alloc(15 << 20).toString("base64") }] });
    expect(body.length).to.be.greaterThan(20_000_000);
    const url = `${fylr!.url}/slotbroker.v1.QueueService/Submit`;
    const response = await fetch(url, { method: "POST", headers: { "content-type": "application/json" }, body });
    const answer = (await response.json()) as { code: string; message: string };
    expect(answer.code, answer.message).to.equal("resource_exhausted");
    expect(answer.message).to.equal("request body: larger than the 16777216 bytes a request message may have here (http.maxRequestBytes)");
    expect(response.status).to.equal(413);
    const dir = tempDir();
    const file = dir.file("submit.json", Buffer.from(body));
    for (const extra of [[], ["-H", "transfer-encoding: chunked"]]) {
      const result = await curl(["-w", "\n%{http_code}", "-H", "content-type: application/json", ...extra, "--data-binary", `@${file}`, url]);
      expect(statusAndBody(result).status, `${extra.join(" ")} ${result.stderr}`).to.equal(413);
      expect(JSON.parse(statusAndBody(result).body)).to.deep.equal(answer);
    }
    // curl asks first (Expect: 100-continue) for a body this size: the 413 comes instead of
    // the 100, and none of the 20 MB is sent.
    const asked = await curl(["-o", "/dev/null", "-w", "%{http_code} %{size_upload}", "-H", "content-type: application/json", "--data-binary", `@${file}`, url]);
    expect(asked.stdout.toString().trim(), asked.stderr).to.equal("413 0");
    await release(dir);
    // A Connect client learns the code from the body.
    const err = await submitError(fylr!, { calls: [{ service: "echo", stdin: { case: "stdinData", value: Buffer.alloc(17 << 20) } }] });
    expect(err.code).to.equal(Code.ResourceExhausted);
    // And a normal submit still works.
    const ok = await fylr!.client.submit({ calls: [{ service: "echo", args: ["hi"] }] });
    expect(ok.created).to.equal(true);
  });

  it("finding 4: one job's oversize spec fails alone; its sibling on the same broker stream carries on", async function () {
    this.timeout(60_000);
    const replica = await startReplica({ addresses: [exec!.grpcAddress], connectTimeout: "30s" }, "siblings");
    try {
      const sibling = replica.exec.run({ service: "sleep", args: ["1"] });
      await waitFor("the sibling to run", async () => (await exec!.status()).waitgroups[0]!.running === 1);
      let error: Error | undefined;
      await replica.exec.run({ service: "echo", args: ["y".repeat(2_000_000)] }).catch((err: Error) => (error = err));
      expect(error?.message).to.match(/args: 2000000 bytes, more than 262144/);
      const result = await sibling;
      expect(result.receipt.exitCode, result.receipt.errorMessage).to.equal(0);
    } finally {
      await stopReplica(replica);
    }
  });

  it("finding 5: connections trickling their headers are closed after http.headersTimeout; the port keeps serving", async function () {
    this.timeout(60_000);
    await start({ http: { headersTimeout: "1s", idleTimeout: "1s" } });
    const port = Number(new URL(fylr!.url).port);
    const trickling = await Promise.all(Array.from({ length: 20 }, () => openSocket(port)));
    sockets.push(...trickling);
    const closed = new Set<Socket>();
    for (const s of trickling) s.once("close", () => closed.add(s));
    const header = "GET /healthz HTTP/1.1\r\nhost: x\r\nx-slow: ";
    let i = 0;
    const drip = setInterval(() => {
      for (const s of trickling) if (!s.destroyed) s.write(header[i % header.length]!);
      i++;
    }, 200);
    try {
      await waitFor("every trickling connection to be closed", () => closed.size === trickling.length, 5_000, 50);
    } finally {
      clearInterval(drip);
    }
    // An idle kept-alive connection is closed too.
    const idle = await openSocket(port);
    sockets.push(idle);
    let answer = "";
    let idleClosed = false;
    idle.on("data", (b: Buffer) => (answer += b.toString("latin1")));
    idle.once("close", () => (idleClosed = true));
    idle.write("GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n");
    await waitFor("the answer on the idle connection", () => answer.startsWith("HTTP/1.1 200"), 5_000, 25);
    await waitFor(`the idle connection to be closed (answer: ${JSON.stringify(answer.slice(0, 120))})`, () => idleClosed, 5_000, 25);
    expect((await fetch(`${fylr!.url}/healthz`)).status).to.equal(200);
  });

  it("finding 5: a connection that sends nothing is closed after http.headersTimeout, an idle HTTP/2 connection after http.idleTimeout", async function () {
    this.timeout(60_000);
    await start({ http: { headersTimeout: "1s", idleTimeout: "1s" } });
    const port = Number(new URL(fylr!.url).port);
    const silent = await openSocket(port);
    sockets.push(silent);
    await closedWithin(silent, 5_000, "a connection that sent nothing");
    // HTTP/2 (how gRPC clients reach this port): one call, then no stream and no traffic.
    const session = http2.connect(fylr!.url);
    session.on("error", () => undefined);
    try {
      const answer = session.request({ ":path": "/healthz" });
      answer.resume();
      await new Promise((ended) => answer.once("close", ended));
      await closedWithin(session, 5_000, "an HTTP/2 connection with no stream");
    } finally {
      session.destroy();
    }
    expect((await fetch(`${fylr!.url}/healthz`)).status).to.equal(200);
  });

  it("finding 5: connections past http.maxConnections are closed at once; those open keep being served", async function () {
    this.timeout(60_000);
    await start({ http: { maxConnections: 20 } });
    const port = Number(new URL(fylr!.url).port);
    const held = await Promise.all(Array.from({ length: 30 }, () => openSocket(port)));
    sockets.push(...held);
    const closed = new Set<Socket>();
    for (const s of held) s.once("close", () => closed.add(s));
    await waitFor("the connections over the cap to be closed", () => closed.size >= 10, 5_000, 50);
    expect(closed.size).to.equal(10);
    for (const s of held.filter((x) => !closed.has(x)).slice(0, 12)) s.destroy();
    await waitFor("the port to serve again", async () => (await fetch(`${fylr!.url}/healthz`)).status === 200, 5_000, 50);
  });

  it("finding 7: a NUL character in an argument, env value or idempotency key is a 400 naming the field", async function () {
    this.timeout(60_000);
    await start();
    const arg = await submitError(fylr!, { calls: [{ service: "echo", args: ["ok", "a\u0000b"] }] });
    expect(arg.code).to.equal(Code.InvalidArgument);
    expect(arg.rawMessage).to.equal("calls[0].args[1]: must not contain a NUL character");
    const key = await submitError(fylr!, { calls: [{ service: "echo" }], idempotencyKey: "k\u0000" });
    expect(key.code).to.equal(Code.InvalidArgument);
    expect(key.rawMessage).to.equal("idempotency_key: must not contain a NUL character");
  });

  it("an item id of 10 KB is refused with a short invalid_argument by every call that takes one, never echoed", async function () {
    this.timeout(60_000);
    await start();
    const id = "a".repeat(10_240);
    const expected = `id: not a UUID: "${"a".repeat(40)}"… (10240 characters)`;
    for (const method of ["Cancel", "Get", "Position", "Retry", "Delete"]) {
      const res = await fetch(`${fylr!.url}/slotbroker.v1.QueueService/${method}`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ id }) });
      const text = await res.text();
      expect(res.status, method).to.equal(400);
      expect(text.length, `${method}: ${text.slice(0, 200)}`).to.be.lessThan(200);
      expect(JSON.parse(text)).to.deep.equal({ code: "invalid_argument", message: expected });
    }
    // Watch (a server stream) and the output route too.
    let watched: ConnectError | undefined;
    try {
      for await (const _ of fylr!.client.watch({ id })) break;
    } catch (err) {
      watched = ConnectError.from(err);
    }
    expect([watched?.code, watched?.rawMessage]).to.deep.equal([Code.InvalidArgument, expected]);
    const output = await fetch(`${fylr!.url}/queue/items/${id}/output`);
    expect(output.status).to.equal(400);
    expect((await output.text()).length).to.be.lessThan(200);
  });

  it("finding 7: stdin_url outside dispatcher.stdinUrlPrefixes is refused at submit", async function () {
    this.timeout(60_000);
    await start({ dispatcher: { stdinUrlPrefixes: ["https://files.example.com/"] } });
    const err = await submitError(fylr!, { calls: [{ service: "echo", stdin: { case: "stdinUrl", value: "http://169.254.169.254/latest/meta-data/" } }] });
    expect(err.code).to.equal(Code.InvalidArgument);
    expect(err.rawMessage).to.match(/^calls\[0\]\.stdin_url: not under an allowed prefix \(dispatcher\.stdinUrlPrefixes\)/);
    // Inside the prefix only as text: escapes a server decodes and resolves lead elsewhere.
    for (const url of [
      "https://files.example.com/..%2f..%2flatest/meta-data",
      "https://files.example.com/a/%2e%2e%2f%2e%2e%2fadmin",
      "https://files.example.com/a/..%5c..%5cadmin",
      "https://files.example.com/a/%252e%252e/admin",
      "https://files.example.com/a/..;/admin",
    ]) {
      const hostile = await submitError(fylr!, { calls: [{ service: "echo", stdin: { case: "stdinUrl", value: url } }] });
      expect(hostile.code, url).to.equal(Code.InvalidArgument);
      expect(hostile.rawMessage, url).to.match(/^calls\[0\]\.stdin_url: its path .*(cannot be checked against dispatcher\.stdinUrlPrefixes|';' parameter)/);
    }
    const ok = await fylr!.client.submit({ calls: [{ service: "echo", stdin: { case: "stdinUrl", value: "https://files.example.com/a.txt" } }], maxAttempts: 1 });
    expect(ok.created).to.equal(true);
  });
  it("a QueueService body that is not protobuf binary is invalid_argument naming the message, on every method and protocol; the port keeps serving", async function () {
    this.timeout(60_000);
    await start();
    // Hand-made bad bytes: a cut-off field, an illegal wire type, field number 0; for Watch
    // also a varint of 11 bytes.
    const bad = [Buffer.from([0x0a, 0x05, 0x41]), Buffer.from([0x0f]), Buffer.from([0x00, 0x01])];
    const longVarint = Buffer.from([0x08, ...Array<number>(10).fill(0xff), 0x01]);
    const unary = QueueService.methods.filter((m) => m.methodKind === "unary");
    expect(unary.map((m) => m.name)).to.include.members(["Submit", "Get", "Cancel", "List", "Delete"]);
    for (const method of unary) {
      for (const body of bad) {
        const res = await fetch(`${fylr!.url}/slotbroker.v1.QueueService/${method.name}`, { method: "POST", headers: { "content-type": "application/proto" }, body });
        const answer = (await res.json()) as { code: string; message: string };
        expect(res.status, `${method.name}: ${answer.message}`).to.equal(400);
        expect(answer.code).to.equal("invalid_argument");
        expect(answer.message).to.match(new RegExp(`^request body: not a valid ${method.input.typeName.replace(/\./g, "\\.")} in protobuf binary \\(.+\\)$`));
      }
    }
    // Watch, a server stream over the Connect protocol: the end-of-stream error says so.
    const envelope = Buffer.concat([Buffer.from([0, 0, 0, 0, bad[0]!.length]), bad[0]!]);
    const watch = await fetch(`${fylr!.url}/slotbroker.v1.QueueService/Watch`, { method: "POST", headers: { "content-type": "application/connect+proto" }, body: envelope });
    const frame = Buffer.from(await watch.arrayBuffer());
    expect(frame[0], "an end-of-stream envelope").to.equal(0x02);
    expect(JSON.parse(frame.subarray(5).toString())).to.deep.equal({ error: { code: "invalid_argument", message: "request body: not a valid slotbroker.v1.WatchRequest in protobuf binary (premature EOF)" } });
    // gRPC: status 3 (INVALID_ARGUMENT), unary and streaming.
    const client = new grpc.Client(new URL(fylr!.url).host, grpc.credentials.createInsecure());
    try {
      const raw = (b: Buffer): Buffer => b;
      const unaryErr = await new Promise<grpc.ServiceError | null>((resolve) => client.makeUnaryRequest("/slotbroker.v1.QueueService/Get", raw, raw, bad[1]!, (err) => resolve(err)));
      expect(unaryErr?.code).to.equal(grpc.status.INVALID_ARGUMENT);
      expect(unaryErr?.details).to.equal("request body: not a valid slotbroker.v1.GetRequest in protobuf binary (illegal tag: field no 1 wire type 7)");
      const streamErr = await new Promise<grpc.ServiceError>((resolve) => {
        const call = client.makeServerStreamRequest("/slotbroker.v1.QueueService/Watch", raw, raw, longVarint);
        call.on("data", () => undefined);
        call.on("error", resolve);
      });
      expect(streamErr.code).to.equal(grpc.status.INVALID_ARGUMENT);
      expect(streamErr.details).to.equal("request body: not a valid slotbroker.v1.WatchRequest in protobuf binary (invalid varint)");
    } finally {
      client.close();
    }
    // The same port serves well-formed requests in both encodings.
    const ok = await fetch(`${fylr!.url}/slotbroker.v1.QueueService/Submit`, {
      method: "POST",
      headers: { "content-type": "application/proto" },
      body: toBinary(SubmitRequestSchema, create(SubmitRequestSchema, { calls: [{ service: "echo", args: ["hi"] }] })),
    });
    expect(ok.status).to.equal(200);
    expect(fromBinary(SubmitResponseSchema, new Uint8Array(await ok.arrayBuffer())).created).to.equal(true);
    expect((await fetch(`${fylr!.url}/healthz`)).status).to.equal(200);
  });
});
