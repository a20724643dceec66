import type { BrokerCore, Waitgroup } from "../broker-core.js";
import type { ServiceConfig } from "../config.js";
import { exceedsBytes, limits } from "../limits.js";
import { TokenSource } from "../slot-ledger.js";

// The pure core of the pre-broker token protocol. A token is a slot of the shared ledger,
// reserved like an offer; redeeming it runs the job in that slot, and an unredeemed token
// gives the slot back when its TTL runs out. No sockets, no timers: the HTTP layer calls
// expireDue() when nextExpiry() says so. Time comes from the injected clock.

/** Why GET /token is refused. */
export type TokenRefusalCode = "unknown-service" | "draining" | "wants-parked" | "no-slot";

/** A refused GET /token, with the reason in words. */
export interface TokenRefusal {
  readonly refused: TokenRefusalCode;
  readonly message: string;
}

/** Where a token stands: issued until redeemed, released or expired. */
export type TokenState = "issued" | "redeemed" | "released" | "expired";

/** One token: a reserved slot waiting for its PUT /job. */
export class LegacyToken {
  state: TokenState = "issued";
  /** @internal links in the expiry list (all tokens share one TTL: issue order is expiry order) */
  prev: LegacyToken | undefined = undefined;
  /** @internal */
  next: LegacyToken | undefined = undefined;

  constructor(
    /** 128 random bits, base64url: the credential. */
    readonly token: string,
    readonly service: ServiceConfig,
    readonly group: Waitgroup,
    /** Clock ms. */
    readonly expiresAt: number,
  ) {}
}

/** Per-waitgroup counts of the token protocol. */
export interface LegacyCounts {
  /** Slots held by an outstanding token. */
  tokens: number;
  /** Slots running a legacy job. */
  running: number;
  /** Legacy jobs finished since start. */
  done: number;
}

/** Counters since start, for metrics and the status page. */
export interface LegacyTotals {
  issued: number;
  redeemed: number;
  expired: number;
  released: number;
  /** GET /token refusals by reason. */
  refused: Record<TokenRefusalCode, number>;
  /** PUT /job with a token this instance does not hold. */
  notFound: number;
}

/** Options of the token table. */
export interface LegacyTokensOptions {
  /** How long an unredeemed token holds its slot. */
  readonly ttlMs: number;
  /** Monotonic clock in ms (the broker's). */
  readonly now: () => number;
}

/**
 * The token table of one execserver, on top of the broker's slot ledgers. A token is only
 * issued when its waitgroup has a free slot and no want parked, so a polling client never
 * takes a slot ahead of a fylr that asked through the broker.
 */
export class LegacyTokens {
  readonly totals: LegacyTotals = {
    issued: 0,
    redeemed: 0,
    expired: 0,
    released: 0,
    refused: { "unknown-service": 0, draining: 0, "wants-parked": 0, "no-slot": 0 },
    notFound: 0,
  };
  private readonly byToken = new Map<string, LegacyToken>();
  private readonly counts = new Map<Waitgroup, LegacyCounts>();
  private readonly source = new TokenSource();
  private head: LegacyToken | undefined = undefined;
  private tail: LegacyToken | undefined = undefined;

  constructor(
    private readonly broker: BrokerCore,
    private readonly options: LegacyTokensOptions,
  ) {
    for (const group of broker.waitgroups.values()) this.counts.set(group, { tokens: 0, running: 0, done: 0 });
  }

  /** Tokens outstanding right now. */
  get outstanding(): number {
    return this.byToken.size;
  }

  /** The counts of one waitgroup. */
  countsOf(group: Waitgroup): Readonly<LegacyCounts> {
    return this.counts.get(group)!;
  }

  /** GET /token/{service}: reserves a slot and returns its token, or says why not. */
  issue(serviceName: string): LegacyToken | TokenRefusal {
    const service = this.broker.service(serviceName);
    if (!service) {
      const shown = exceedsBytes(serviceName, limits.serviceBytes) ? `${serviceName.slice(0, 64)}…` : serviceName;
      return this.refuse("unknown-service", `service "${shown}" is not served here`);
    }
    if (this.broker.draining) return this.refuse("draining", "execserver is draining");
    const { group } = service;
    // Parked wants come first: they asked earlier and the broker serves them by priority.
    if (group.book.size > 0) {
      return this.refuse("wants-parked", `${group.book.size} broker want(s) of waitgroup ${group.name} are parked; they are served first`);
    }
    if (group.ledger.free <= 0) return this.refuse("no-slot", `no free slot in waitgroup ${group.name} (${group.ledger.processes} slots)`);
    group.ledger.reserve();
    const token = new LegacyToken(this.source.next(), service.config, group, this.options.now() + this.options.ttlMs);
    this.byToken.set(token.token, token);
    this.link(token);
    this.counts.get(group)!.tokens++;
    this.totals.issued++;
    return token;
  }

  /**
   * PUT /job: takes the token out of the table; its slot stays reserved until start() or
   * abandon(). Undefined when this instance holds no such token (never issued here, used,
   * released or expired): the client gets "token not found".
   */
  redeem(token: string): LegacyToken | undefined {
    const found = this.byToken.get(token);
    if (!found) {
      this.totals.notFound++;
      return undefined;
    }
    this.drop(found, "redeemed");
    this.totals.redeemed++;
    return found;
  }

  /** The redeemed token's job starts: its reserved slot becomes a running one. */
  start(token: LegacyToken): void {
    token.group.ledger.accept();
    this.counts.get(token.group)!.running++;
    this.broker.legacyRunning++;
  }

  /** A redeemed token whose job never started (bad job JSON): the slot goes back. */
  abandon(token: LegacyToken): void {
    token.group.ledger.withdraw();
    this.broker.pump(token.group);
  }

  /** A legacy job ended: its slot goes to the next parked want. */
  finish(token: LegacyToken, runtimeMs: number): void {
    const counts = this.counts.get(token.group)!;
    token.group.ledger.finish(runtimeMs);
    counts.running--;
    counts.done++;
    this.broker.legacyRunning--;
    this.broker.pump(token.group);
  }

  /** DELETE: gives an unredeemed token's slot back at once. False when there is no such token. */
  release(token: string): boolean {
    const found = this.byToken.get(token);
    if (!found) {
      this.totals.notFound++;
      return false;
    }
    this.drop(found, "released");
    this.totals.released++;
    found.group.ledger.withdraw();
    this.broker.pump(found.group);
    return true;
  }

  /** Expires every token whose TTL ran out; their slots go to the next wants. Returns how many. */
  expireDue(): number {
    const now = this.options.now();
    let expired = 0;
    for (let token = this.head; token && token.expiresAt <= now; token = this.head) {
      this.drop(token, "expired");
      this.totals.expired++;
      token.group.ledger.withdraw();
      this.broker.pump(token.group);
      expired++;
    }
    return expired;
  }

  /** When the oldest outstanding token expires (clock ms); undefined when there is none. */
  nextExpiry(): number | undefined {
    return this.head?.expiresAt;
  }

  private refuse(refused: TokenRefusalCode, message: string): TokenRefusal {
    this.totals.refused[refused]++;
    return { refused, message };
  }

  // Out of the table and the expiry list; the slot is still reserved.
  private drop(token: LegacyToken, state: TokenState): void {
    token.state = state;
    this.byToken.delete(token.token);
    this.counts.get(token.group)!.tokens--;
    if (token.prev) token.prev.next = token.next;
    else this.head = token.next;
    if (token.next) token.next.prev = token.prev;
    else this.tail = token.prev;
    token.prev = token.next = undefined;
  }

  private link(token: LegacyToken): void {
    token.prev = this.tail;
    if (this.tail) this.tail.next = token;
    else this.head = token;
    this.tail = token;
  }
}
