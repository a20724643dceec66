import { fromBinary } from "@bufbuild/protobuf";
import { JobSpecSchema, type ConnectRequest, type JobSpec } from "../../gen/slotbroker/v1/broker_pb.js";
import { bail, ended, lenTag, readDuration, readNonce, tryDecode, varintTag, type WireReader } from "../shared/protobuf-wire.js";

// Every frame a fylr sends arrives here first, and protobuf-es's reflective decoder costs
// several microseconds per frame. WANT, UNWANT, JOB, DECLINE and PING are decoded by hand
// (a JobSpec with env or labels maps goes to protobuf-es alone); anything else, or
// anything unexpected, is left to protobuf-es (see shared/protobuf-wire.ts).

/** The ConnectRequest in `bytes`, or undefined when protobuf-es must decode it. */
export function decodeConnectRequestFast(bytes: Uint8Array): ConnectRequest | undefined {
  return tryDecode(bytes, readConnectRequest);
}

function readConnectRequest(r: WireReader): ConnectRequest {
  const t = r.tag();
  const end = r.end();
  let frame: ConnectRequest["frame"];
  switch (t) {
    case lenTag(1):
      frame = { case: "want", value: readWant(r, end) };
      break;
    case lenTag(2):
      frame = { case: "unwant", value: { $typeName: "slotbroker.v1.Unwant", jobId: readIdOnly(r, end) } };
      break;
    case lenTag(3):
      frame = { case: "job", value: readJob(r, end) };
      break;
    case lenTag(4): {
      const [jobId, offerToken] = readIdAndToken(r, end);
      frame = { case: "decline", value: { $typeName: "slotbroker.v1.Decline", jobId, offerToken } };
      break;
    }
    case lenTag(5):
      frame = { case: "ping", value: { $typeName: "slotbroker.v1.Ping", nonce: readNonce(r, end) } };
      break;
    default:
      return bail();
  }
  // One frame per message: a second oneof field (last one wins) is protobuf-es's business.
  if (r.pos !== r.length) bail();
  return { $typeName: "slotbroker.v1.ConnectRequest", frame };
}

function readWant(r: WireReader, end: number): Extract<ConnectRequest["frame"], { case: "want" }>["value"] {
  const want = { $typeName: "slotbroker.v1.Want" as const, jobId: "", service: "", priority: 0, fairnessKey: "", fairnessWeight: 0 };
  while (r.pos < end) {
    const t = r.tag();
    if (t === lenTag(1)) want.jobId = r.string();
    else if (t === lenTag(2)) want.service = r.string();
    else if (t === varintTag(3)) want.priority = r.int32();
    else if (t === lenTag(4)) want.fairnessKey = r.string();
    else if (t === varintTag(5)) want.fairnessWeight = r.uint32();
    else bail();
  }
  return ended(r, end, want);
}

function readJob(r: WireReader, end: number): Extract<ConnectRequest["frame"], { case: "job" }>["value"] {
  let jobId = "";
  let offerToken = "";
  let spec: JobSpec | undefined;
  let traceparent = "";
  while (r.pos < end) {
    const t = r.tag();
    if (t === lenTag(1)) jobId = r.string();
    else if (t === lenTag(2)) offerToken = r.string();
    else if (t === lenTag(3) && spec === undefined) spec = readSpec(r);
    else if (t === lenTag(4)) traceparent = r.string();
    else bail();
  }
  const job = { $typeName: "slotbroker.v1.Job" as const, jobId, offerToken, spec, traceparent };
  if (spec === undefined) delete job.spec;
  return ended(r, end, job);
}

// args, timeout, stdin_url, stdout_url and stdin_inline by hand; a spec with maps (env, labels) or
// anything else is decoded by protobuf-es.
const EMPTY = new Uint8Array(0);

function readSpec(r: WireReader): JobSpec {
  const end = r.end();
  const start = r.pos;
  const spec: JobSpec = { $typeName: "slotbroker.v1.JobSpec", args: [], env: {}, stdinUrl: "", stdoutUrl: "", labels: {}, stdinInline: EMPTY };
  let timeoutSeen = false;
  while (r.pos < end) {
    const t = r.tag();
    if (t === lenTag(1)) spec.args.push(r.string());
    else if (t === lenTag(4)) spec.stdinUrl = r.string();
    else if (t === lenTag(5)) spec.stdoutUrl = r.string();
    else if (t === lenTag(7)) spec.stdinInline = r.bytes();
    else if (t === lenTag(3) && !timeoutSeen) {
      timeoutSeen = true;
      spec.timeout = readDuration(r, r.end());
    } else {
      r.pos = end;
      return fromBinary(JobSpecSchema, r.view(start, end));
    }
  }
  return ended(r, end, spec);
}

function readIdOnly(r: WireReader, end: number): string {
  let jobId = "";
  while (r.pos < end) {
    if (r.tag() === lenTag(1)) jobId = r.string();
    else bail();
  }
  return ended(r, end, jobId);
}

function readIdAndToken(r: WireReader, end: number): [string, string] {
  let jobId = "";
  let offerToken = "";
  while (r.pos < end) {
    const t = r.tag();
    if (t === lenTag(1)) jobId = r.string();
    else if (t === lenTag(2)) offerToken = r.string();
    else bail();
  }
  return ended(r, end, [jobId, offerToken]);
}

