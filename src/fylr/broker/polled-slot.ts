import type { Readable, Writable } from "node:stream";
import type { Receipt } from "../../../gen/slotbroker/v1/broker_pb.js";
import { Transitions } from "../../shared/lifecycle.js";
import type { TokenGrant } from "../../shared/legacy-protocol.js";
import { releaseToken, runWithToken, type LegacyJob, type TokenEndpoint } from "../legacy/token-http.js";

/** A polled slot's lifecycle: granted until the job is sent or the token given back. */
export type PolledSlotState = "granted" | "started" | "released";

const transitions = new Transitions<PolledSlotState>("polled slot", { granted: ["started", "released"], started: [], released: [] });

/**
 * A slot won by polling an address that does not serve BrokerService: a token from its
 * GET /token. Run the job with `run` (stdin as the request body, stdout from the response)
 * before the token expires, or give it back with `release`.
 */
export class PolledSlot {
  /** Tells this slot from a broker Slot. */
  readonly transport = "polling" as const;
  readonly jobId: string;
  readonly service: string;
  /** The configured address whose pool polled. */
  readonly address: string;
  /** The instance that issued the token ("polling:ADDRESS" when it did not say). */
  readonly instanceId: string;
  /** When the token lapses (Date.now() based). */
  readonly expiresAt: number;
  private current: PolledSlotState = "granted";

  constructor(
    jobId: string,
    service: string,
    address: string,
    readonly endpoint: TokenEndpoint,
    readonly grant: TokenGrant,
    now = Date.now(),
  ) {
    this.jobId = jobId;
    this.service = service;
    this.address = address;
    this.instanceId = grant.instanceId || `polling:${address}`;
    this.expiresAt = now + (grant.expiresInMs || 10_000);
  }

  /** granted, started or released. */
  get state(): PolledSlotState {
    return this.current;
  }

  /**
   * PUT /job with the token: resolves with the receipt, writing stdout into `stdout` (ended
   * after the last byte). Rejects with TokenNotFoundError, or DATA_LOSS when the response
   * broke off; see runWithToken.
   */
  run(job: LegacyJob, stdin: Readable | Uint8Array | undefined, stdout: Writable, signal?: AbortSignal): Promise<Receipt> {
    this.setState("started");
    return runWithToken(this.endpoint, this.grant.token, job, stdin, stdout, signal);
  }

  /** Gives the token's slot back at once (DELETE /job); best effort, never rejects. */
  decline(): void {
    if (this.current !== "granted") return;
    this.setState("released");
    releaseToken(this.endpoint, this.grant.token).catch(() => undefined);
  }

  private setState(next: PolledSlotState): void {
    this.current = transitions.check(this.current, next);
  }
}
