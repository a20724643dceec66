import { setMaxListeners } from "node:events";
import type { IncomingMessage, ServerResponse } from "node:http";
import { performance } from "node:perf_hooks";
import { ErrorKind, type Receipt } from "../../../gen/slotbroker/v1/broker_pb.js";
import { AbortReason, linkedAbortController, workOver } from "../../shared/abort.js";
import { trustBody } from "../../shared/http-deadlines.js";
import { INSTANCE_HEADER, TOKEN_PARAM, type LegacyErrorBody, type TokenGrant } from "../../shared/legacy-protocol.js";
import type { Logger } from "../../shared/log.js";
import type { BearerAuth } from "../auth.js";
import type { Events } from "../../shared/typed-events.js";
import type { ExecserverEvents } from "../events.js";
import { failedReceipt } from "../effects.js";
import { runJob as defaultRunJob, type RunJob } from "../runner/index.js";
import { parseLegacyJob, runLegacyJob } from "./job.js";
import type { LegacyToken, LegacyTokens, TokenRefusalCode } from "./tokens.js";

/** What the token protocol needs from the execserver around it. */
export interface LegacyTransportOptions {
  readonly tokens: LegacyTokens;
  readonly instanceId: string;
  readonly ttlMs: number;
  readonly auth: BearerAuth;
  /** Where requests and legacy jobs are told (metrics listen). */
  readonly events: Events<ExecserverEvents>;
  readonly logger: Logger;
  /** Runs command services; default: the process runner. */
  readonly runJob: RunJob | undefined;
  /** Called after each finished legacy job (drain waits on it). */
  readonly jobFinished: () => void;
}

const refusalStatus: Record<TokenRefusalCode, number> = {
  "unknown-service": 404,
  draining: 503,
  "wants-parked": 503,
  "no-slot": 503,
};

/**
 * The pre-broker token protocol over HTTP/1.1, for fylrs that only know it: GET
 * /token/{service} reserves a slot of the shared ledger, PUT /job?token=… runs the job in
 * it, DELETE /job?token=… gives an unused token back. It keeps the one timer that expires
 * tokens and the controllers of running legacy jobs (shutdown aborts them).
 */
export class LegacyTransport {
  private readonly shutdown = new AbortController();
  private expiryTimer: NodeJS.Timeout | undefined;
  private expiryAt = Infinity;

  constructor(private readonly options: LegacyTransportOptions) {
    // One listener per running legacy job.
    setMaxListeners(0, this.shutdown.signal);
  }

  /** The token table. */
  get tokens(): LegacyTokens {
    return this.options.tokens;
  }

  /** Routes one request under /token/ or /job; never throws. */
  handle(request: IncomingMessage, response: ServerResponse): Promise<void> | void {
    const url = new URL(request.url ?? "/", "http://legacy");
    const endpoint = url.pathname.startsWith("/token/") ? "token" : url.pathname === "/job" ? "job" : "other";
    response.once("finish", () => this.options.events.emit("legacy:request", endpoint, response.statusCode));
    response.once("close", () => {
      if (!response.writableFinished) this.options.events.emit("legacy:request", endpoint, 499);
    });
    if (!this.options.auth.checkHeader(request.headers.authorization)) {
      response.setHeader("www-authenticate", "Bearer");
      return this.refuse(response, 401, "unauthenticated", "missing or wrong bearer token");
    }
    if (endpoint === "token") {
      if (request.method !== "GET") return this.notAllowed(response, "GET");
      return this.issue(url, response);
    }
    if (endpoint === "job") {
      if (request.method === "PUT") return this.redeem(url, request, response);
      if (request.method === "DELETE") return this.release(url, response);
      return this.notAllowed(response, "PUT, DELETE");
    }
    return this.refuse(response, 404, "bad-request", "not found; the token protocol serves GET /token/{service}, PUT /job, DELETE /job");
  }

  /** Aborts every running legacy job (shutdown); their receipts still arrive. */
  abortAll(reason: string): void {
    this.shutdown.abort(new AbortReason("shutdown", reason));
  }

  /** Stops the expiry timer. */
  stop(): void {
    clearTimeout(this.expiryTimer);
    this.expiryTimer = undefined;
    this.expiryAt = Infinity;
  }

  private issue(url: URL, response: ServerResponse): void {
    let service: string;
    try {
      service = decodeURIComponent(url.pathname.slice("/token/".length));
    } catch {
      return this.refuse(response, 400, "bad-request", "service: not a valid percent-encoded name");
    }
    const result = this.tokens.issue(service);
    if (!("token" in result)) {
      if (result.refused !== "unknown-service") response.setHeader("retry-after", "1");
      return this.refuse(response, refusalStatus[result.refused], result.refused, result.message);
    }
    this.armExpiry(result.expiresAt);
    const grant: TokenGrant = {
      token: result.token,
      service,
      waitgroup: result.group.name,
      instanceId: this.options.instanceId,
      expiresInMs: this.options.ttlMs,
    };
    this.json(response, 200, grant);
  }

  private async redeem(url: URL, request: IncomingMessage, response: ServerResponse): Promise<void> {
    const value = url.searchParams.get(TOKEN_PARAM);
    if (!value) return this.refuse(response, 400, "bad-request", `${TOKEN_PARAM}: missing (PUT /job?${TOKEN_PARAM}=…)`);
    const token = this.tokens.redeem(value);
    // The old incident class: the PUT reached an instance that never issued this token.
    if (!token) return this.refuse(response, 404, "token-not-found", "token not found (expired, used, or issued by another instance)");
    const job = parseLegacyJob(url, token);
    if ("error" in job) {
      this.tokens.abandon(token);
      return this.refuse(response, 400, "bad-request", job.error);
    }
    // A redeemed token holds a slot: the body is the job's stdin, at its source's pace.
    trustBody(request);
    await this.runRedeemed(token, job, request, response);
  }

  private async runRedeemed(
    token: LegacyToken,
    job: Exclude<ReturnType<typeof parseLegacyJob>, { error: string }>,
    request: IncomingMessage,
    response: ServerResponse,
  ): Promise<void> {
    // Linked by hand, not AbortSignal.any: on Node 20 that keeps every job's signal
    // referenced from the long-lived shutdown signal.
    const controller = linkedAbortController(this.shutdown.signal);
    this.tokens.start(token);
    this.options.events.emit("legacy:started", token);
    const startedAt = performance.now();
    let receipt: Receipt | undefined;
    try {
      receipt = await runLegacyJob({
        token,
        job,
        request,
        response,
        runJob: this.options.runJob ?? defaultRunJob,
        instanceId: this.options.instanceId,
        signal: controller.signal,
      });
      this.options.logger.debug({ service: token.service.name, exitCode: receipt.exitCode, error: receipt.error }, "legacy job done");
    } catch (err) {
      this.options.logger.error({ err }, "legacy job failed");
      response.destroy();
    } finally {
      controller.abort(workOver);
      this.tokens.finish(token, performance.now() - startedAt);
      this.options.events.emit("legacy:done", token, receipt ?? failedReceipt(ErrorKind.UNSPECIFIED, "the legacy job failed inside the execserver"));
      this.options.jobFinished();
    }
  }

  private release(url: URL, response: ServerResponse): void {
    const value = url.searchParams.get(TOKEN_PARAM);
    if (!value) return this.refuse(response, 400, "bad-request", `${TOKEN_PARAM}: missing (DELETE /job?${TOKEN_PARAM}=…)`);
    if (!this.tokens.release(value)) return this.refuse(response, 404, "token-not-found", "token not found (expired, used, or issued by another instance)");
    response.writeHead(204, { [INSTANCE_HEADER]: this.options.instanceId }).end();
  }

  // One timer for all tokens, armed for the oldest (they share one TTL).
  private armExpiry(at: number): void {
    if (at >= this.expiryAt) return;
    clearTimeout(this.expiryTimer);
    this.expiryAt = at;
    this.expiryTimer = setTimeout(() => {
      this.expiryTimer = undefined;
      this.expiryAt = Infinity;
      try {
        const expired = this.tokens.expireDue();
        if (expired > 0) this.options.logger.debug({ expired }, "legacy tokens expired unredeemed");
      } catch (err) {
        this.options.logger.error({ err }, "legacy token expiry failed");
      }
      const next = this.tokens.nextExpiry();
      if (next !== undefined) this.armExpiry(next);
    }, Math.max(0, at - performance.now()) + 1);
    this.expiryTimer.unref();
  }

  private notAllowed(response: ServerResponse, allow: string): void {
    response.setHeader("allow", allow);
    this.refuse(response, 405, "method-not-allowed", `method not allowed; use ${allow}`);
  }

  private refuse(response: ServerResponse, status: number, reason: string, error: string): void {
    const body: LegacyErrorBody = { error, reason };
    this.json(response, status, body);
  }

  private json(response: ServerResponse, status: number, body: object): void {
    response.writeHead(status, { "content-type": "application/json", [INSTANCE_HEADER]: this.options.instanceId });
    response.end(`${JSON.stringify(body)}\n`);
  }
}
