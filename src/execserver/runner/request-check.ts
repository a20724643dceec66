import { ErrorKind } from "../../../gen/slotbroker/v1/broker_pb.js";
import type { JobFailure } from "./receipt.js";
import type { RunRequest } from "./types.js";

/** setTimeout's ceiling (~24.8 days); longer timeouts would fire at once. */
export const MAX_TIMEOUT_MS = 2 ** 31 - 1;

/** Why a request cannot be run at all, or undefined when it can. Pure. */
export function checkRequest(request: RunRequest): JobFailure | undefined {
  if (request.command.length === 0 || !request.command[0]) {
    return { kind: ErrorKind.SPAWN_FAILED, message: "invalid request: command is empty" };
  }
  if (!(request.timeoutMs > 0)) {
    return { kind: ErrorKind.SPAWN_FAILED, message: `invalid request: timeoutMs must be positive, got ${request.timeoutMs}` };
  }
  for (const [name, url] of [
    ["stdin", request.stdinUrl],
    ["stdout", request.stdoutUrl],
  ] as const) {
    if (url && !parsePipeUrl(url)) {
      return { kind: ErrorKind.PIPE_FAILED, message: `invalid ${name} URL ${JSON.stringify(url)}: must be http(s)` };
    }
  }
  return undefined;
}

/** The URL when it is a usable http(s) pipe URL, else undefined. */
export function parsePipeUrl(raw: string): URL | undefined {
  let url: URL;
  try {
    url = new URL(raw);
  } catch {
    return undefined;
  }
  return url.protocol === "http:" || url.protocol === "https:" ? url : undefined;
}
