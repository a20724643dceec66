import { Code, SlotbrokerError } from "../../shared/errors.js";
import { Transitions } from "../../shared/lifecycle.js";

/**
 * Where one acquisition stands: "parked" while it waits for its first offer, "won" once an
 * offer was taken, "ended" when it gave up (timeout, abort, failure). Only "parked" moves.
 */
export type RaceState = "parked" | "won" | "ended";

/** What to do with an offer for a race. */
export type OfferVerdict<C> =
  | { readonly accept: true; /** Where the want is still parked: UNWANT there. */ readonly unwant: readonly C[] }
  | { readonly accept: false };

const transitions = new Transitions<RaceState>("want race", { parked: ["won", "ended"], won: [], ended: [] });

/**
 * The bookkeeping of one want parked on several connections at once, racing for the first
 * offer. Pure: `C` is whatever identifies a connection; no frames are sent from here.
 */
export class WantRace<C> {
  private current: RaceState = "parked";
  private readonly parked = new Set<C>();
  private winner: C | undefined;

  constructor(
    readonly jobId: string,
    readonly service: string,
    readonly priority: number,
    /** When the acquisition started (for the oldest-want growth signal and errors). */
    readonly startedAt: number,
  ) {}

  /** The race's lifecycle state. */
  get state(): RaceState {
    return this.current;
  }

  /** The connection whose offer won, once won. */
  get wonOn(): C | undefined {
    return this.winner;
  }

  /** Connections the want is parked on. */
  get parkedOn(): ReadonlySet<C> {
    return this.parked;
  }

  /** Records a WANT on `conn`; false when the race is over or it is parked there already. */
  park(conn: C): boolean {
    if (this.current !== "parked" || this.parked.has(conn)) return false;
    this.parked.add(conn);
    return true;
  }

  /** Forgets `conn` (it dropped the want, closed, or turned out to be a duplicate). */
  unpark(conn: C): void {
    this.parked.delete(conn);
  }

  /**
   * An OFFER arrived on `conn`. The first one wins and names the other connections to
   * UNWANT; every later one (or one after the race ended) must be DECLINEd.
   */
  offer(conn: C): OfferVerdict<C> {
    if (this.current !== "parked") return { accept: false };
    this.setState("won");
    this.winner = conn;
    this.parked.delete(conn);
    const unwant = [...this.parked];
    this.parked.clear();
    return { accept: true, unwant };
  }

  /** Gives up while parked; returns the connections to UNWANT (none if already over). */
  end(): C[] {
    if (this.current !== "parked") return [];
    this.setState("ended");
    const unwant = [...this.parked];
    this.parked.clear();
    return unwant;
  }

  private setState(next: RaceState): void {
    this.current = transitions.check(this.current, next);
  }
}

/** Who takes an OFFER: a race, and whether it takes a surplus offer made for another want. */
export interface OfferTaker<R> {
  readonly race: R;
  readonly substitute: boolean;
}

/** How the offered want was parked on the offering connection (undefined: it was UNWANTed there). */
export interface ParkedAs {
  readonly service: string;
  readonly priority: number;
}

/**
 * The parked races of one fylr, by job id and by service, so that a newly reached instance
 * finds the wants it can serve without a scan over every parked want.
 */
export class RaceBook<C, R extends WantRace<C> = WantRace<C>> {
  private readonly byJob = new Map<string, R>();
  private readonly byService = new Map<string, Set<R>>();

  /** Parked races. */
  get size(): number {
    return this.byJob.size;
  }

  /** Adds a parked race; throws on a duplicate job id. */
  add(race: R): void {
    if (this.byJob.has(race.jobId)) throw new SlotbrokerError(Code.AlreadyExists, `duplicate job id ${race.jobId}`);
    this.byJob.set(race.jobId, race);
    let set = this.byService.get(race.service);
    if (!set) this.byService.set(race.service, (set = new Set()));
    set.add(race);
  }

  /** The race for `jobId`, if it is still in the book. */
  get(jobId: string): R | undefined {
    return this.byJob.get(jobId);
  }

  /** Removes a race (won or ended). */
  delete(race: R): void {
    if (this.byJob.get(race.jobId) !== race) return;
    this.byJob.delete(race.jobId);
    const set = this.byService.get(race.service);
    set?.delete(race);
    if (set?.size === 0) this.byService.delete(race.service);
  }

  /** The races waiting for `service`. */
  forService(service: string): Iterable<R> {
    return this.byService.get(service) ?? [];
  }

  /**
   * The oldest race still parked on `conn` for `service` at `minPriority` or above: the
   * want that may take a surplus offer made there in that priority class. Races of a
   * service are kept in acquisition order and nearly all are parked on every connection,
   * so the scan usually stops at the first.
   */
  oldestParkedOn(conn: C, service: string, minPriority: number): R | undefined {
    for (const race of this.forService(service)) {
      if (race.state === "parked" && race.priority >= minPriority && race.parkedOn.has(conn)) return race;
    }
    return undefined;
  }

  /**
   * Who takes an OFFER for `jobId` made on `conn`; undefined means DECLINE. Its own race,
   * unless that is over and the offer is surplus but still good here (`parkedAs` set: no
   * UNWANT went out). Every instance serves a connection's oldest want, so their turns often
   * land on the same one; a DECLINE would cost this connection its turn and per-connection
   * round-robin would stop meaning equal slots per fylr. So the oldest other race parked on
   * `conn` in that service and priority class takes the slot (the JOB still names the
   * offered job id, as the server expects).
   */
  takerOf(jobId: string, conn: C, parkedAs: ParkedAs | undefined): OfferTaker<R> | undefined {
    const own = this.byJob.get(jobId);
    if (own?.state === "parked" || !parkedAs) return own && { race: own, substitute: false };
    const other = this.oldestParkedOn(conn, parkedAs.service, parkedAs.priority);
    return other && { race: other, substitute: true };
  }

  /** Every race in the book. */
  all(): Iterable<R> {
    return this.byJob.values();
  }
}
