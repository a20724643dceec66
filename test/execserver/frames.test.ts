import { create, toBinary } from "@bufbuild/protobuf";
import { expect } from "chai";
import { ConnectRequestSchema, ConnectResponseSchema, JobSpecSchema, ReceiptSchema, type ConnectRequest, type JobSpec } from "../../gen/slotbroker/v1/broker_pb.js";
import { decodeConnectRequestFast } from "../../src/execserver/frames-decode.js";
import { encodeDone } from "../../src/execserver/frames.js";
import { encodeJob, encodeWant } from "../../src/fylr/broker/frames.js";
import { corrupt, expectAgreement, Rand, randomReceipt, type Agreement } from "../support/fuzz-frames.js";

function randomSpec(rand: Rand): JobSpec | undefined {
  if (rand.chance(0.2)) return undefined;
  return create(JobSpecSchema, {
    args: Array.from({ length: rand.int(4) }, () => rand.string()),
    env: rand.chance(0.2) ? { A: rand.string() } : {},
    timeout: rand.chance(0.4) ? { seconds: BigInt(rand.int32()), nanos: rand.int32() } : undefined,
    stdinUrl: rand.chance(0.5) ? `http://127.0.0.1:1/pipe/in/${rand.string()}` : "",
    stdoutUrl: rand.chance(0.5) ? `http://127.0.0.1:1/pipe/out/${rand.string()}` : "",
    labels: rand.chance(0.2) ? { item: rand.string() } : {},
    stdinInline: rand.chance(0.3) ? randomBytes(rand) : new Uint8Array(0),
  });
}

// Stdin of 1 to 70 000 bytes: one-, two- and three-byte length prefixes.
function randomBytes(rand: Rand): Uint8Array {
  const length = rand.pick([1, 127, 128, 300, 16_384, 65_536, 70_000]) - rand.int(2);
  return Uint8Array.from({ length: Math.max(1, length) }, () => rand.int(256));
}

function randomRequest(rand: Rand): ConnectRequest {
  const jobId = rand.string();
  const frames: ConnectRequest["frame"][] = [
    {
      case: "want",
      value: { $typeName: "slotbroker.v1.Want", jobId, service: rand.string(), priority: rand.int32(), fairnessKey: rand.string(), fairnessWeight: rand.pick([0, 1, 3, 1000, 2 ** 32 - 1]) },
    },
    { case: "unwant", value: { $typeName: "slotbroker.v1.Unwant", jobId } },
    { case: "job", value: { $typeName: "slotbroker.v1.Job", jobId, offerToken: rand.string(), spec: randomSpec(rand), traceparent: rand.string() } },
    { case: "decline", value: { $typeName: "slotbroker.v1.Decline", jobId, offerToken: rand.string() } },
    { case: "ping", value: { $typeName: "slotbroker.v1.Ping", nonce: rand.uint64() } },
    { case: "query", value: { $typeName: "slotbroker.v1.Query", jobId } },
  ];
  return create(ConnectRequestSchema, { frame: rand.pick(frames) });
}

describe("execserver hand decoder (WANT, UNWANT, JOB, DECLINE, PING)", () => {
  it("agrees with protobuf-es on 5 000 random frames and takes the hot ones itself", () => {
    const rand = new Rand(15);
    const tally: Agreement = { handDecoded: 0, leftToProtobufEs: 0 };
    for (let i = 0; i < 5_000; i++) {
      const request = randomRequest(rand);
      const bytes = toBinary(ConnectRequestSchema, request);
      const before = tally.handDecoded;
      expectAgreement(ConnectRequestSchema, decodeConnectRequestFast, bytes, tally);
      const spec = request.frame.case === "job" ? request.frame.value.spec : undefined;
      const maps = spec !== undefined && (Object.keys(spec.env).length > 0 || Object.keys(spec.labels).length > 0);
      // Only QUERY is left to protobuf-es; a JobSpec with maps is decoded by it inside the hand-decoded JOB.
      if (request.frame.case !== "query") expect(tally.handDecoded, `${request.frame.case} maps=${maps}`).to.equal(before + 1);
    }
    expect(tally.handDecoded).to.be.greaterThan(3_500);
  });

  it("agrees with protobuf-es on 5 000 corrupted frames (flipped, cut, merged, junk)", () => {
    const rand = new Rand(1515);
    const tally: Agreement = { handDecoded: 0, leftToProtobufEs: 0 };
    for (let i = 0; i < 5_000; i++) {
      const bytes = toBinary(ConnectRequestSchema, randomRequest(rand));
      const other = toBinary(ConnectRequestSchema, randomRequest(rand));
      expectAgreement(ConnectRequestSchema, decodeConnectRequestFast, corrupt(rand, bytes, other), tally);
    }
    expect(tally.leftToProtobufEs).to.be.greaterThan(250);
  });

  it("reads the fylr's own hand-encoded WANT and JOB", () => {
    const want = decodeConnectRequestFast(encodeWant("j-1", "sha256", -3));
    expect(want?.frame.case === "want" && want.frame.value).to.include({ jobId: "j-1", service: "sha256", priority: -3, fairnessKey: "", fairnessWeight: 0 });
    const keyed = decodeConnectRequestFast(encodeWant("j-2", "sha256", 0, "tenant-ü", 3000));
    expect(keyed?.frame.case === "want" && keyed.frame.value).to.include({ jobId: "j-2", fairnessKey: "tenant-ü", fairnessWeight: 3000 });
    const spec = create(JobSpecSchema, { args: ["-x"], stdinUrl: "http://h/in", stdoutUrl: "http://h/out" });
    const job = decodeConnectRequestFast(encodeJob("j-1", "tok", spec));
    expect(job?.frame.case === "job" && job.frame.value.spec?.args).to.deep.equal(["-x"]);
    const stdin = Buffer.alloc(65_536, 7);
    const inline = decodeConnectRequestFast(encodeJob("j-2", "tok", create(JobSpecSchema, { stdoutUrl: "http://h/out", stdinInline: stdin })));
    const inlineSpec = inline?.frame.case === "job" ? inline.frame.value.spec : undefined;
    expect(Buffer.from(inlineSpec?.stdinInline ?? []).equals(stdin)).to.equal(true);
    expect(inlineSpec?.stdinUrl).to.equal("");
    const traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
    const traced = decodeConnectRequestFast(encodeJob("j-3", "tok", spec, traceparent));
    expect(traced?.frame.case === "job" && traced.frame.value.traceparent).to.equal(traceparent);
  });
});

describe("execserver hand-encoded DONE", () => {
  it("writes the same bytes as protobuf-es for 5 000 random receipts", () => {
    const rand = new Rand(17);
    for (let i = 0; i < 5_000; i++) {
      const receipt = randomReceipt(rand) ?? create(ReceiptSchema, {});
      const jobId = rand.string();
      const expected = toBinary(ConnectResponseSchema, create(ConnectResponseSchema, { frame: { case: "done", value: { jobId, receipt } } }));
      const actual = encodeDone(jobId, receipt);
      expect(actual && Buffer.from(expected).equals(actual), `receipt ${i}`).to.equal(true);
    }
  });

  it("leaves a receipt with unknown fields to protobuf-es", () => {
    const receipt = create(ReceiptSchema, { exitCode: 0 });
    receipt.$unknown = [{ no: 99, wireType: 0, data: Uint8Array.of(1) }];
    expect(encodeDone("j", receipt)).to.equal(undefined);
  });
});

describe("fylr hand-encoded JOB", () => {
  it("writes the same bytes as protobuf-es for 5 000 random specs", () => {
    const rand = new Rand(18);
    for (let i = 0; i < 5_000; i++) {
      const spec = randomSpec(rand) ?? create(JobSpecSchema, {});
      const [jobId, offerToken] = [rand.string(), rand.string()];
      const expected = toBinary(ConnectRequestSchema, create(ConnectRequestSchema, { frame: { case: "job", value: { jobId, offerToken, spec } } }));
      expect(Buffer.from(expected).equals(encodeJob(jobId, offerToken, spec)), `spec ${i}`).to.equal(true);
    }
  });
});
