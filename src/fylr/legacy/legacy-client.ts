import type { Readable, Writable } from "node:stream";
import type { Receipt } from "../../../gen/slotbroker/v1/broker_pb.js";
import { sleep } from "../../shared/abort.js";
import { silentLogger, type Logger } from "../../shared/log.js";
import { NoSlotError, UnknownServiceError } from "../broker/errors.js";
import { BufferCollector } from "../exec-client-sinks.js";
import { requestToken, runWithToken, type LegacyJob, type TokenEndpoint } from "./token-http.js";

/** Settings of a polling client. */
export interface LegacyClientOptions {
  /** The execservers' token protocol endpoints, tried in this order every round. */
  readonly endpoints: readonly TokenEndpoint[];
  /** Pause between rounds while every endpoint is busy (default 1 s, as the old fylrs did). */
  readonly pollIntervalMs?: number;
  /** Give up with NoSlotError after this long (default 30 s). */
  readonly connectTimeoutMs?: number;
  readonly logger?: Logger;
}

/** One job for the polling client. */
export interface LegacyRunOptions extends LegacyJob {
  readonly service: string;
  /** The request body; empty when unset. */
  readonly stdin?: Readable | Uint8Array;
  /** Where stdout goes; collected into a Buffer when unset. */
  readonly stdout?: Writable;
  readonly signal?: AbortSignal;
  /** Called once a token was granted, just before the PUT, with the instance that issued it. */
  readonly onStart?: (instanceId: string) => void;
}

/** What a job run by polling produced. */
export interface LegacyRunResult {
  readonly receipt: Receipt;
  /** The collected stdout when no `stdout` stream was given. */
  readonly stdout: Buffer | undefined;
  /** The instance that issued the token and ran the job. */
  readonly instanceId: string;
  /** GET /token requests this job made. */
  readonly tokenRequests: number;
}

/** Counters of a polling client. */
export interface LegacyClientStats {
  tokenRequests: number;
  busy: number;
  jobs: number;
  noSlot: number;
}

/**
 * The pre-broker fylr's way to run a job: GET /token/{service} on every execserver in turn,
 * once a second, until one hands out a token or connectTimeout passes; then PUT /job with
 * it. Kept for migration tests and as the baseline of the idle-and-gap benchmark.
 */
export class LegacyClient {
  readonly stats: LegacyClientStats = { tokenRequests: 0, busy: 0, jobs: 0, noSlot: 0 };
  private readonly logger: Logger;

  constructor(private readonly options: LegacyClientOptions) {
    this.logger = (options.logger ?? silentLogger).child({ component: "legacy-client" });
  }

  /** Polls for a token and runs the job; a failed command is a receipt, not an exception. */
  async run(options: LegacyRunOptions): Promise<LegacyRunResult> {
    const interval = this.options.pollIntervalMs ?? 1000;
    const timeoutMs = this.options.connectTimeoutMs ?? 30_000;
    const deadline = Date.now() + timeoutMs;
    let requests = 0;
    for (;;) {
      const roundStart = Date.now();
      let unknown = 0;
      for (const endpoint of this.options.endpoints) {
        options.signal?.throwIfAborted();
        requests++;
        this.stats.tokenRequests++;
        let answer;
        try {
          answer = await requestToken(endpoint, options.service, options.signal);
        } catch (err) {
          if (options.signal?.aborted) throw err;
          this.logger.debug({ url: endpoint.url.origin, err: (err as Error).message }, "GET /token failed");
          continue;
        }
        if (answer.kind === "unknown-service") unknown++;
        if (answer.kind === "busy") this.stats.busy++;
        if (answer.kind !== "token") continue;
        const collector = options.stdout ? undefined : new BufferCollector();
        options.onStart?.(answer.grant.instanceId);
        const receipt = await runWithToken(endpoint, answer.grant.token, options, options.stdin, options.stdout ?? collector!, options.signal);
        this.stats.jobs++;
        return { receipt, stdout: collector?.toBuffer(), instanceId: answer.grant.instanceId, tokenRequests: requests };
      }
      if (unknown === this.options.endpoints.length) throw new UnknownServiceError(options.service, [], unknown);
      const now = Date.now();
      if (now >= deadline) {
        this.stats.noSlot++;
        throw new NoSlotError(options.service, timeoutMs, this.options.endpoints.length);
      }
      await sleep(Math.min(deadline, roundStart + interval) - now, options.signal);
    }
  }
}
