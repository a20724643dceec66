import { create, toBinary } from "@bufbuild/protobuf";
import { expect } from "chai";
import {
  ConnectResponseSchema,
  HelloSchema,
  type ConnectResponse,
} from "../../gen/slotbroker/v1/broker_pb.js";
import { OfferEncoder } from "../../src/execserver/frames.js";
import { decodeConnectResponseFast } from "../../src/fylr/broker/frames-decode.js";
import { corrupt, expectAgreement, Rand, randomReceipt, type Agreement } from "../support/fuzz-frames.js";

function randomResponse(rand: Rand): ConnectResponse {
  const jobId = rand.string();
  const frames: ConnectResponse["frame"][] = [
    {
      case: "offer",
      value: {
        $typeName: "slotbroker.v1.Offer",
        jobId,
        offerToken: rand.string(),
        expiresIn: rand.chance(0.9) ? { $typeName: "google.protobuf.Duration", seconds: BigInt(rand.int32()), nanos: rand.int32() } : undefined,
        waitgroup: rand.string(),
      },
    },
    { case: "done", value: { $typeName: "slotbroker.v1.Done", jobId, receipt: randomReceipt(rand) } },
    { case: "pong", value: { $typeName: "slotbroker.v1.Pong", nonce: rand.uint64() } },
    { case: "hello", value: create(HelloSchema, { instanceId: rand.string(), services: { s: "w" }, clients: rand.int(9) }) },
    { case: "offerExpired", value: { $typeName: "slotbroker.v1.OfferExpired", jobId, offerToken: rand.string() } },
  ];
  return create(ConnectResponseSchema, { frame: rand.pick(frames) });
}

describe("fylr hand decoder (OFFER, DONE, PONG)", () => {
  it("agrees with protobuf-es on 5 000 random frames and takes the hot ones itself", () => {
    const rand = new Rand(16);
    const tally: Agreement = { handDecoded: 0, leftToProtobufEs: 0 };
    for (let i = 0; i < 5_000; i++) {
      const response = randomResponse(rand);
      const before = tally.handDecoded;
      expectAgreement(ConnectResponseSchema, decodeConnectResponseFast, toBinary(ConnectResponseSchema, response), tally);
      const hot = response.frame.case === "offer" || response.frame.case === "done" || response.frame.case === "pong";
      expect(tally.handDecoded, response.frame.case).to.equal(before + (hot ? 1 : 0));
    }
  });

  it("agrees with protobuf-es on 5 000 corrupted frames (flipped, cut, merged, junk)", () => {
    const rand = new Rand(1616);
    const tally: Agreement = { handDecoded: 0, leftToProtobufEs: 0 };
    for (let i = 0; i < 5_000; i++) {
      const bytes = toBinary(ConnectResponseSchema, randomResponse(rand));
      const other = toBinary(ConnectResponseSchema, randomResponse(rand));
      expectAgreement(ConnectResponseSchema, decodeConnectResponseFast, corrupt(rand, bytes, other), tally);
    }
    expect(tally.leftToProtobufEs).to.be.greaterThan(250);
  });

  it("reads the execserver's hand-encoded OFFER", () => {
    const decoded = decodeConnectResponseFast(new OfferEncoder(5_000).encode("j-ü", "tok", "wg"));
    expect(decoded?.frame.case === "offer" && decoded.frame.value).to.deep.include({ jobId: "j-ü", offerToken: "tok", waitgroup: "wg" });
    expect(decoded?.frame.case === "offer" && decoded.frame.value.expiresIn?.seconds).to.equal(5n);
  });
});
