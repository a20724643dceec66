import type { IncomingMessage, ServerResponse } from "node:http";
import { fromJsonString } from "@bufbuild/protobuf";
import { ErrorKind, JobSpecSchema, type Receipt } from "../../../gen/slotbroker/v1/broker_pb.js";
import { AbortReason, linkedAbortController, workOver } from "../../shared/abort.js";
import { INSTANCE_HEADER, JOB_PARAM, RECEIPT_HEADER, encodeReceiptHeader } from "../../shared/legacy-protocol.js";
import { builtins, failedReceipt } from "../effects.js";
import { checkJobSpec, type CheckedJob } from "../limits.js";
import type { RunJob } from "../runner/index.js";
import type { LegacyToken } from "./tokens.js";

/** The job of a PUT /job, or why it cannot run (answered 400, the token's slot given back). */
export function parseLegacyJob(url: URL, token: LegacyToken): CheckedJob | { readonly error: string } {
  const text = url.searchParams.get(JOB_PARAM);
  let spec;
  try {
    spec = text === null || text === "" ? undefined : fromJsonString(JobSpecSchema, text);
  } catch (err) {
    return { error: `${JOB_PARAM}: not a job (JSON of a JobSpec): ${(err as Error).message}` };
  }
  const checked = checkJobSpec(spec, token.service);
  if ("error" in checked) return { error: `${JOB_PARAM}: ${checked.error.replace(/^spec\./, "")}` };
  if (checked.stdinUrl || checked.stdinInline || checked.stdoutUrl) {
    return { error: `${JOB_PARAM}: stdinUrl/stdinInline/stdoutUrl are not used by the token protocol: stdin is the request body, stdout the response body` };
  }
  return checked;
}

/** What running one legacy job needs. */
export interface LegacyJobContext {
  readonly token: LegacyToken;
  readonly job: CheckedJob;
  readonly request: IncomingMessage;
  readonly response: ServerResponse;
  readonly runJob: RunJob;
  readonly instanceId: string;
  /** Aborted on shutdown; the client going away aborts the job too. */
  readonly signal: AbortSignal;
}

/**
 * Runs a redeemed job with stdin from the request body and stdout into the response body,
 * and answers with its receipt. Output that fits the 4000-byte buffer is sent whole with
 * the receipt in a header; longer output is streamed (chunked) and, after a clean success,
 * followed by the receipt in a trailer. A failure after streaming began breaks the
 * response off (no final chunk), so a client never mistakes it for a short success.
 */
export async function runLegacyJob(ctx: LegacyJobContext): Promise<Receipt> {
  const { response } = ctx;
  // Set now, sent with the first streamed byte; replaced below when nothing was streamed.
  response.statusCode = 200;
  response.setHeader("content-type", "application/octet-stream");
  response.setHeader(INSTANCE_HEADER, ctx.instanceId);
  response.setHeader("trailer", RECEIPT_HEADER);
  const receipt = await run(ctx);
  receipt.instanceId = ctx.instanceId;
  if (response.destroyed || response.writableEnded) return receipt;
  if (response.headersSent) {
    // Streamed and settled cleanly (a failure destroyed the response already).
    response.addTrailers({ [RECEIPT_HEADER]: encodeReceiptHeader(receipt) });
    response.end();
    return receipt;
  }
  response.removeHeader("trailer");
  response.setHeader(RECEIPT_HEADER, encodeReceiptHeader(receipt));
  response.setHeader("content-length", receipt.stdoutPrefix.byteLength);
  response.end(receipt.stdoutPrefix);
  return receipt;
}

async function run(ctx: LegacyJobContext): Promise<Receipt> {
  const service = ctx.token.service;
  if (service.kind === "builtin") return builtins[service.builtin]();
  const controller = linkedAbortController(ctx.signal);
  // The client closing its connection is the legacy transport's goodbye: stop the job.
  const onClose = (): void => {
    if (!ctx.response.writableFinished) controller.abort(new AbortReason("disconnected", "the legacy client closed the connection"));
  };
  ctx.response.once("close", onClose);
  try {
    return await ctx.runJob({
      command: service.command,
      args: ctx.job.args,
      env: ctx.job.env,
      timeoutMs: ctx.job.timeoutMs,
      stdin: ctx.request,
      stdout: ctx.response,
      signal: controller.signal,
    });
  } catch (err) {
    return failedReceipt(ErrorKind.SPAWN_FAILED, `runner failed: ${(err as Error)?.message ?? String(err)}`);
  } finally {
    ctx.response.off("close", onClose);
    // The job is over; this only unhooks the controller from the shutdown signal.
    controller.abort(workOver);
  }
}
