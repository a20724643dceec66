import { ErrorKind, type Receipt } from "../../gen/slotbroker/v1/broker_pb.js";

/** True when the receipt reports a clean exit: code 0, no signal, no error. */
export function receiptSucceeded(receipt: Receipt): boolean {
  return receipt.exitCode === 0 && receipt.signal === "" && receipt.error === ErrorKind.UNSPECIFIED;
}
