import type { TokenGrant } from "../../shared/legacy-protocol.js";
import type { Logger } from "../../shared/log.js";
import { releaseToken, requestToken } from "../legacy/token-http.js";
import type { Acquisition } from "./acquisition.js";
import type { BrokerClientStats } from "./events.js";
import type { AddressPool } from "./pool.js";

/** What the polling rounds need from the broker client. */
export interface TokenPollsOptions {
  /** Every address pool; only those polling at the time are asked. */
  readonly pools: readonly AddressPool[];
  /** One round per waiting acquisition this often. */
  readonly intervalMs: number;
  readonly stats: BrokerClientStats;
  /** A token came while the acquisition was still parked. */
  readonly won: (acq: Acquisition, pool: AddressPool, grant: TokenGrant) => void;
  /** A polled address answered 404 for the acquisition's service. */
  readonly unknown: (acq: Acquisition) => void;
  readonly logger: Logger;
}

// A GET /token that takes longer than this counts as a failed attempt for the round.
const REQUEST_TIMEOUT_MS = 5_000;

/**
 * The old polling loop, per waiting acquisition, against the addresses that do not serve
 * BrokerService: one round a second asks each polling address in turn for a token with
 * GET /token/{service}, until one grants it or the acquisition ends (an OFFER won, the
 * connect timeout passed, or it was aborted). A token that arrives after the acquisition
 * ended is given back at once.
 */
export class TokenPolls {
  constructor(private readonly options: TokenPollsOptions) {}

  /** Starts polling for `acq` unless it already polls or no address is polled. */
  start(acq: Acquisition): void {
    if (acq.polling || acq.state !== "parked" || !this.anyPolling()) return;
    acq.polling = true;
    void this.round(acq);
  }

  private anyPolling(): boolean {
    return this.options.pools.some((pool) => pool.transport === "polling");
  }

  private async round(acq: Acquisition): Promise<void> {
    const started = Date.now();
    for (const pool of this.options.pools) {
      if (acq.state !== "parked") break;
      const endpoint = pool.endpoint;
      if (!endpoint || !pool.mayServe(acq.service)) continue;
      this.options.stats.tokenRequests++;
      let answer;
      try {
        answer = await requestToken(endpoint, acq.service, AbortSignal.timeout(REQUEST_TIMEOUT_MS));
      } catch (err) {
        this.options.logger.debug({ address: pool.address, err: (err as Error).message }, "GET /token failed");
        continue;
      }
      if (answer.kind === "unknown-service") {
        pool.markUnknown(acq.service);
        this.options.unknown(acq);
        continue;
      }
      if (answer.kind === "busy") continue;
      if (acq.state !== "parked") {
        // An OFFER (or the timeout) won while the GET was in flight: free the slot now.
        releaseToken(endpoint, answer.grant.token).catch(() => undefined);
        break;
      }
      acq.polling = false;
      this.options.won(acq, pool, answer.grant);
      return;
    }
    if (acq.state !== "parked" || !this.anyPolling()) {
      acq.polling = false;
      return;
    }
    acq.pollTimer = setTimeout(() => void this.round(acq), Math.max(0, started + this.options.intervalMs - Date.now()));
  }
}
