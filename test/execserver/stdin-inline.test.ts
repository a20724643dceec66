import { expect } from "chai";
import { createHash, randomBytes } from "node:crypto";
import { createServer } from "node:http";
import type { AddressInfo } from "node:net";
import { create, toBinary } from "@bufbuild/protobuf";
import * as grpc from "@grpc/grpc-js";
import { ConnectRequestSchema, ErrorKind, RejectCode } from "../../gen/slotbroker/v1/broker_pb.js";
import { limits } from "../../src/execserver/limits.js";
import { track } from "../../harness/resources.js";
import { BrokerStream, closeLater, releaseAll } from "./support/broker-stream.js";
import { startTestServer } from "./support/server.js";

const sha256 = (data: Uint8Array): string => createHash("sha256").update(data).digest("hex");

const services = {
  cat: { waitgroup: "w", command: ["cat"] },
  sha: { waitgroup: "w", command: ["sha256sum"] },
  ignore: { waitgroup: "w", command: ["true"] },
};

/** Runs one job on `stream` and returns its receipt (or the reject). */
async function runJob(stream: BrokerStream, jobId: string, service: string, spec: Parameters<BrokerStream["job"]>[2]) {
  stream.want(jobId, service);
  const offer = await stream.next("offer");
  stream.job(jobId, offer.offerToken, spec);
  return stream.next("done", 20_000);
}

for (const jobLauncher of [true, false])
describe(`execserver: JobSpec.stdin_inline over gRPC (jobLauncher: ${jobLauncher})`, function () {
  this.timeout(30_000);
  afterEach(releaseAll);

  const start = () => startTestServer({ jobLauncher, waitgroups: { w: { processes: 2 } }, services });

  it('advertises "stdin-inline" and writes the bytes to the command\'s stdin, then closes it', async () => {
    const server = await start();
    const a = await BrokerStream.open(server.grpcAddress, { awaitHello: false });
    expect((await a.next("hello")).capabilities).to.include("stdin-inline");
    const small = randomBytes(3000);
    const echoed = await runJob(a, "cat", "cat", { stdinInline: small });
    expect(echoed.receipt?.exitCode, echoed.receipt?.errorMessage).to.equal(0);
    expect(Buffer.from(echoed.receipt!.stdoutPrefix).equals(small)).to.equal(true);
    // Exactly at the limit: 64 KiB, hashed by the command (it ends only on EOF).
    const full = randomBytes(limits.stdinInlineBytes);
    const hashed = await runJob(a, "sha", "sha", { stdinInline: full });
    expect(hashed.receipt?.exitCode).to.equal(0);
    expect(Buffer.from(hashed.receipt!.stdoutPrefix).toString()).to.equal(`${sha256(full)}  -\n`);
  });

  it("survives a command that exits without reading its inline stdin", async () => {
    const server = await start();
    const a = await BrokerStream.open(server.grpcAddress);
    for (let i = 0; i < 5; i++) {
      const done = await runJob(a, `i${i}`, "ignore", { stdinInline: randomBytes(limits.stdinInlineBytes) });
      expect(done.receipt).to.include({ exitCode: 0, error: ErrorKind.UNSPECIFIED });
    }
    expect(server.state).to.equal("serving");
  });

  it("rejects an oversize stdin_inline, or one next to stdin_url, with INVALID_ARGUMENT; nothing runs", async () => {
    const server = await start();
    const a = await BrokerStream.open(server.grpcAddress);
    const cases: [Parameters<BrokerStream["job"]>[2], RegExp][] = [
      [{ stdinInline: randomBytes(limits.stdinInlineBytes + 1) }, /^spec\.stdin_inline: 65537 bytes, more than 65536; send larger stdin through spec\.stdin_url/],
      [{ stdinInline: randomBytes(900 * 1024) }, /^spec\.stdin_inline: 921600 bytes, more than 65536/],
      [{ stdinInline: Buffer.from("x"), stdinUrl: "http://127.0.0.1:1/in" }, /^spec\.stdin_inline: set together with spec\.stdin_url; set at most one of them/],
    ];
    for (const [i, [spec, message]] of cases.entries()) {
      a.want(`j${i}`, "cat");
      const offer = await a.next("offer");
      a.job(`j${i}`, offer.offerToken, spec);
      const reject = await a.next("reject");
      expect(reject).to.include({ jobId: `j${i}`, code: RejectCode.INVALID_ARGUMENT });
      expect(reject.message).to.match(message);
    }
    const w = server.status().waitgroups.find((g) => g.name === "w")!;
    expect(w).to.include({ running: 0, offered: 0, free: 2, completed: 0n });
    // The stream stayed up.
    const ok = await runJob(a, "after", "cat", { stdinInline: Buffer.from("still here") });
    expect(Buffer.from(ok.receipt!.stdoutPrefix).toString()).to.equal("still here");
  });

  it("fails only the stream whose JOB frame is over the gRPC limit; the server and other streams go on", async () => {
    const server = await start();
    const a = await BrokerStream.open(server.grpcAddress);
    a.want("big", "cat");
    const offer = await a.next("offer");
    const client = closeLater(track(new grpc.Client(server.grpcAddress, grpc.credentials.createInsecure(), { "grpc.use_local_subchannel_pool": 1 }), "raw client", (c) => c.close()));
    const identity = (b: Buffer): Buffer => b;
    const raw = client.makeBidiStreamRequest("/slotbroker.v1.BrokerService/Connect", identity, identity);
    raw.on("data", () => undefined);
    raw.on("error", () => undefined);
    const status = new Promise<grpc.StatusObject>((resolve) => raw.on("status", resolve));
    const huge = create(ConnectRequestSchema, {
      frame: { case: "job", value: { jobId: "big", offerToken: offer.offerToken, spec: { stdinInline: new Uint8Array(2 * 1024 * 1024) } } },
    });
    raw.write(Buffer.from(toBinary(ConnectRequestSchema, huge)));
    expect((await status).code).to.equal(grpc.status.RESOURCE_EXHAUSTED);
    // The offer belongs to `a`, not to the raw stream: `a` can still accept it.
    a.job("big", offer.offerToken, { stdinInline: Buffer.from("fine") });
    const done = await a.next("done", 20_000);
    expect(Buffer.from(done.receipt!.stdoutPrefix).toString()).to.equal("fine");
    expect(server.state).to.equal("serving");
  });

  it("still reads stdin_url when no inline stdin is given", async () => {
    const body = randomBytes(100_000);
    const http = createServer((_req, res) => res.end(body));
    await new Promise<void>((resolve) => http.listen(0, "127.0.0.1", resolve));
    closeLater(track(http, "stdin server", (h) => new Promise<void>((resolve) => h.close(() => resolve()))));
    const server = await start();
    const a = await BrokerStream.open(server.grpcAddress);
    const done = await runJob(a, "url", "sha", { stdinUrl: `http://127.0.0.1:${(http.address() as AddressInfo).port}/in` });
    expect(Buffer.from(done.receipt!.stdoutPrefix).toString()).to.equal(`${sha256(body)}  -\n`);
  });
});
