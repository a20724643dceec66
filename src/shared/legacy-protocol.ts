/**
 * The wire format of the pre-broker token protocol, shared by the execserver that serves it
 * and the fylr clients that poll it (docs/protocol.md, "Legacy token protocol"):
 *
 *   GET    /token/{service}           200 {token, …} | 503 busy | 404 unknown service
 *   PUT    /job?token=T&job=JSON      body: stdin → response body: stdout, receipt
 *   DELETE /job?token=T               gives an unused token's slot back (an extension)
 */
import { clone, fromJsonString, toJson } from "@bufbuild/protobuf";
import { ReceiptSchema, type Receipt } from "../../gen/slotbroker/v1/broker_pb.js";
import { Code, SlotbrokerError } from "./errors.js";

/** Header (output fit the buffer) or trailer (output was streamed) carrying the receipt. */
export const RECEIPT_HEADER = "slotbroker-receipt";

/** Response header naming the execserver instance that answered. */
export const INSTANCE_HEADER = "slotbroker-instance-id";

/** Query parameter of PUT /job and DELETE /job holding the token. */
export const TOKEN_PARAM = "token";

/** Query parameter of PUT /job holding the job as JSON (a JobSpec in its JSON form). */
export const JOB_PARAM = "job";

/** The body of a 200 answer to GET /token/{service}. */
export interface TokenGrant {
  /** Single use; redeem with PUT /job?token=… at the same instance within expiresInMs. */
  readonly token: string;
  readonly service: string;
  readonly waitgroup: string;
  readonly instanceId: string;
  readonly expiresInMs: number;
}

/** The body of every refusal: what was wrong, and a stable reason. */
export interface LegacyErrorBody {
  readonly error: string;
  /**
   * "unknown-service", "draining", "wants-parked", "no-slot", "token-not-found",
   * "bad-request", "unauthenticated", "method-not-allowed".
   */
  readonly reason: string;
}

/**
 * The receipt as one header/trailer value: its JSON form without the stdout prefix (the
 * response body is the stdout), with non-ASCII escaped so it is a valid header value.
 */
export function encodeReceiptHeader(receipt: Receipt): string {
  const copy = clone(ReceiptSchema, receipt);
  copy.stdoutPrefix = new Uint8Array(0);
  return JSON.stringify(toJson(ReceiptSchema, copy)).replace(
    /[\u007f-\uffff]/g,
    (c) => `\\u${c.charCodeAt(0).toString(16).padStart(4, "0")}`,
  );
}

/** Parses a receipt header/trailer value; throws a DATA_LOSS error naming the problem. */
export function decodeReceiptHeader(value: string): Receipt {
  try {
    return fromJsonString(ReceiptSchema, value, { ignoreUnknownFields: true });
  } catch (err) {
    throw new SlotbrokerError(Code.DataLoss, `${RECEIPT_HEADER}: not a receipt: ${(err as Error).message}`, { cause: err });
  }
}
