import type { ConnectResponse, Receipt } from "../../../gen/slotbroker/v1/broker_pb.js";
import { bail, ended, lenTag, readDuration, readNonce, tryDecode, varintTag, type WireReader } from "../../shared/protobuf-wire.js";

// The frames a fylr receives per job, OFFER and DONE (and PONG), are decoded by hand:
// protobuf-es's reflective decoder costs several microseconds per frame on the grant
// path. HELLO, POSITION, REJECT, OFFER_EXPIRED and anything unexpected are left to
// protobuf-es (see shared/protobuf-wire.ts), so both always agree.

/** The ConnectResponse in `bytes`, or undefined when protobuf-es must decode it. */
export function decodeConnectResponseFast(bytes: Uint8Array): ConnectResponse | undefined {
  return tryDecode(bytes, readConnectResponse);
}

type Offer = Extract<ConnectResponse["frame"], { case: "offer" }>["value"];
type Done = Extract<ConnectResponse["frame"], { case: "done" }>["value"];

function readConnectResponse(r: WireReader): ConnectResponse {
  const t = r.tag();
  const end = r.end();
  let frame: ConnectResponse["frame"];
  if (t === lenTag(2)) frame = { case: "offer", value: readOffer(r, end) };
  else if (t === lenTag(3)) frame = { case: "done", value: readDone(r, end) };
  else if (t === lenTag(4)) frame = { case: "pong", value: { $typeName: "slotbroker.v1.Pong", nonce: readNonce(r, end) } };
  else return bail();
  if (r.pos !== r.length) bail();
  return { $typeName: "slotbroker.v1.ConnectResponse", frame };
}

function readOffer(r: WireReader, end: number): Offer {
  const offer: Offer = { $typeName: "slotbroker.v1.Offer", jobId: "", offerToken: "", waitgroup: "" };
  while (r.pos < end) {
    const t = r.tag();
    if (t === lenTag(1)) offer.jobId = r.string();
    else if (t === lenTag(2)) offer.offerToken = r.string();
    else if (t === lenTag(3) && offer.expiresIn === undefined) offer.expiresIn = readDuration(r, r.end());
    else if (t === lenTag(4)) offer.waitgroup = r.string();
    else bail();
  }
  return ended(r, end, offer);
}

function readDone(r: WireReader, end: number): Done {
  const value: Done = { $typeName: "slotbroker.v1.Done", jobId: "" };
  while (r.pos < end) {
    const t = r.tag();
    if (t === lenTag(1)) value.jobId = r.string();
    else if (t === lenTag(2) && value.receipt === undefined) value.receipt = readReceipt(r, r.end());
    else bail();
  }
  return ended(r, end, value);
}

function readReceipt(r: WireReader, end: number): Receipt {
  const receipt: Receipt = {
    $typeName: "slotbroker.v1.Receipt",
    signal: "",
    stderrLine: "",
    stdoutPrefix: new Uint8Array(0),
    stdoutBytes: 0n,
    stdoutStreamed: false,
    error: 0,
    errorMessage: "",
    instanceId: "",
  };
  while (r.pos < end) {
    const t = r.tag();
    if (t === varintTag(1)) receipt.exitCode = r.int32();
    else if (t === lenTag(2)) receipt.signal = r.string();
    else if (t === lenTag(3) && receipt.duration === undefined) receipt.duration = readDuration(r, r.end());
    else if (t === lenTag(4)) receipt.stderrLine = r.string();
    else if (t === lenTag(5)) receipt.stdoutPrefix = r.bytes();
    else if (t === varintTag(6)) receipt.stdoutBytes = r.uint64();
    else if (t === varintTag(7)) receipt.stdoutStreamed = r.bool();
    else if (t === varintTag(8)) receipt.error = r.int32();
    else if (t === lenTag(9)) receipt.errorMessage = r.string();
    else if (t === lenTag(10)) receipt.instanceId = r.string();
    else bail();
  }
  return ended(r, end, receipt);
}

