import { expect } from "chai";
import { create, fromBinary, toBinary } from "@bufbuild/protobuf";
import * as grpc from "@grpc/grpc-js";
import { ConnectRequestSchema, ConnectResponseSchema, RejectCode } from "../../gen/slotbroker/v1/broker_pb.js";
import { durationFromMs } from "@bufbuild/protobuf/wkt";
import { track } from "../../harness/resources.js";
import { BrokerStream, closeLater, eventually, releaseAll, statusClient } from "./support/broker-stream.js";
import { startTestServer } from "./support/server.js";

// A client that speaks raw bytes on the Connect method, to send what no stub would.
function rawConnect(address: string, metadata = new grpc.Metadata()): {
  call: grpc.ClientDuplexStream<Buffer, Buffer>;
  status: Promise<grpc.StatusObject>;
  frames: Buffer[];
} {
  const client = closeLater(
    track(new grpc.Client(address, grpc.credentials.createInsecure(), { "grpc.use_local_subchannel_pool": 1 }), "raw client", (c) => c.close()),
  );
  const identity = (b: Buffer): Buffer => b;
  const call = client.makeBidiStreamRequest("/slotbroker.v1.BrokerService/Connect", identity, identity, metadata);
  const frames: Buffer[] = [];
  call.on("data", (b: Buffer) => frames.push(b));
  call.on("error", () => undefined);
  const status = new Promise<grpc.StatusObject>((resolve) => call.on("status", resolve));
  return { call, status, frames };
}

describe("execserver rules for peers", () => {
  afterEach(releaseAll);

  it("rejects a WANT for an unknown service and keeps the stream up", async () => {
    const server = await startTestServer();
    const a = await BrokerStream.open(server.grpcAddress);
    a.want("j", "no-such-service");
    const reject = await a.next("reject");
    expect(reject).to.include({ jobId: "j", code: RejectCode.UNKNOWN_SERVICE });
    expect(reject.message).to.contain("no-such-service");
    a.want("j", "noop");
    expect((await a.next("offer")).jobId).to.equal("j");
  });

  it("rejects a duplicate job_id whether parked, offered or running", async () => {
    const server = await startTestServer();
    const a = await BrokerStream.open(server.grpcAddress);
    a.want("nap", "sleep");
    const offer = await a.next("offer");
    a.want("nap", "sleep");
    expect((await a.next("reject")).code).to.equal(RejectCode.DUPLICATE_JOB);
    a.job("nap", offer.offerToken, { args: ["30"] });
    a.want("nap", "sleep");
    expect((await a.next("reject")).code).to.equal(RejectCode.DUPLICATE_JOB);
    a.job("nap", offer.offerToken, { args: ["30"] });
    expect((await a.next("reject")).code).to.equal(RejectCode.DUPLICATE_JOB);
    a.want("parked", "sleep");
    a.want("parked", "sleep");
    const dup = await a.next("reject");
    expect(dup).to.include({ jobId: "parked", code: RejectCode.DUPLICATE_JOB });
    expect(dup.message).to.contain("parked");
  });

  it("rejects oversize and malformed fields with INVALID_ARGUMENT naming the field", async () => {
    const server = await startTestServer();
    const a = await BrokerStream.open(server.grpcAddress);
    a.want("x".repeat(129), "noop");
    const long = await a.next("reject");
    expect(long.code).to.equal(RejectCode.INVALID_ARGUMENT);
    expect(long.message).to.contain("job_id");
    expect(long.jobId).to.have.length(128);
    a.want("", "noop");
    expect((await a.next("reject")).message).to.contain("job_id");

    const cases: [Parameters<BrokerStream["job"]>[2], string][] = [
      [{ env: { PATH: "/evil" } }, "spec.env"],
      [{ args: Array.from({ length: 5000 }, () => "a") }, "spec.args"],
      [{ args: ["y".repeat(300_000)] }, "spec.args"],
      [{ stdinUrl: "file:///etc/passwd" }, "spec.stdin_url"],
      [{ timeout: durationFromMs(0) }, "spec.timeout"],
    ];
    for (const [i, [spec, field]] of cases.entries()) {
      a.want(`j${i}`, "sleep");
      const offer = await a.next("offer");
      a.job(`j${i}`, offer.offerToken, spec);
      const reject = await a.next("reject");
      expect(reject.code, field).to.equal(RejectCode.INVALID_ARGUMENT);
      expect(reject.message).to.contain(field);
    }
    // Each invalid JOB withdrew its offer, so nothing ran and the slot is free again.
    const slow = server.status().waitgroups.find((w) => w.name === "slow")!;
    expect(slow).to.include({ running: 0, offered: 0, free: 1, completed: 0n });
  });

  it("caps parked wants per connection with RESOURCE_EXHAUSTED", async () => {
    const server = await startTestServer({ maxWantsPerConnection: 3 });
    const holder = await BrokerStream.open(server.grpcAddress);
    holder.want("hold", "noop");
    await holder.next("offer");
    const a = await BrokerStream.open(server.grpcAddress);
    for (let i = 0; i < 4; i++) a.want(`w${i}`, "noop");
    const reject = await a.next("reject");
    expect(reject).to.include({ jobId: "w3", code: RejectCode.RESOURCE_EXHAUSTED });
    a.unwant("w0");
    a.want("w4", "noop");
    await a.ping();
    expect(a.unconsumed("reject")).to.deep.equal([]);
  });

  it("skips an empty or unknown frame kind and keeps serving the stream", async () => {
    const server = await startTestServer();
    const raw = rawConnect(server.grpcAddress);
    // field 99, varint 1: a frame kind from the future
    raw.call.write(Buffer.from([0xf8, 0x06, 0x01]));
    raw.call.write(Buffer.alloc(0));
    raw.call.write(Buffer.from(toBinary(ConnectRequestSchema, create(ConnectRequestSchema, { frame: { case: "ping", value: { nonce: 42n } } }))));
    const pong = await eventually(() => {
      const frames = raw.frames.map((b) => fromBinary(ConnectResponseSchema, b).frame);
      const found = frames.find((f) => f.case === "pong");
      expect(found, "pong").to.not.equal(undefined);
      return found!;
    });
    expect(pong.value).to.include({ nonce: 42n });
    expect(server.status().connections).to.have.length(1);
  });

  it("fails only the call that sends garbage bytes; other connections keep working", async () => {
    const server = await startTestServer();
    const a = await BrokerStream.open(server.grpcAddress);
    const raw = rawConnect(server.grpcAddress);
    raw.call.write(Buffer.from([0x0a, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff]));
    const status = await raw.status;
    expect(status.code).to.equal(grpc.status.INTERNAL);
    const huge = rawConnect(server.grpcAddress);
    huge.call.write(Buffer.alloc(2 * 1024 * 1024, 1));
    expect((await huge.status).code).to.equal(grpc.status.RESOURCE_EXHAUSTED);
    a.want("still", "noop");
    const offer = await a.next("offer");
    a.job("still", offer.offerToken);
    expect((await a.next("done")).receipt?.exitCode).to.equal(0);
    expect(server.state).to.equal("serving");
  });

  it("refuses a missing or wrong token with UNAUTHENTICATED on Connect and GetStatus", async () => {
    const server = await startTestServer({ token: "s3cret-token" });
    const none = await BrokerStream.open(server.grpcAddress, { awaitHello: false });
    expect((await none.ended).code).to.equal(grpc.status.UNAUTHENTICATED);
    const wrong = await BrokerStream.open(server.grpcAddress, { token: "s3cret-tokem", awaitHello: false });
    expect((await wrong.ended).code).to.equal(grpc.status.UNAUTHENTICATED);
    const basic = await BrokerStream.open(server.grpcAddress, { authorization: "Basic s3cret-token", awaitHello: false });
    expect((await basic.ended).code).to.equal(grpc.status.UNAUTHENTICATED);
    const err = (await statusClient(server.grpcAddress, { token: "nope" }).getStatus().catch((e: unknown) => e)) as grpc.ServiceError;
    expect(err.code).to.equal(grpc.status.UNAUTHENTICATED);
    expect(err.details).to.not.contain("s3cret");
    const good = await BrokerStream.open(server.grpcAddress, { token: "s3cret-token" });
    good.want("ok", "noop");
    await good.next("offer");
    expect((await statusClient(server.grpcAddress, { token: "s3cret-token" }).getStatus()).connections).to.have.length(1);
  });
});
