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
 * finds the wants it can serve without a scan over every parked want; and by service and
 * priority class, so that a surplus offer finds the most urgent one.
 */
export class RaceBook<C, R extends WantRace<C> = WantRace<C>> {
  private readonly byJob = new Map<string, R>();
  private readonly byService = new Map<string, Set<R>>();
  private readonly byClass = new Map<string, Map<number, Set<R>>>();

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
    let classes = this.byClass.get(race.service);
    if (!classes) this.byClass.set(race.service, (classes = new Map<number, Set<R>>()));
    let cls = classes.get(race.priority);
    if (!cls) classes.set(race.priority, (cls = new Set()));
    cls.add(race);
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
    const classes = this.byClass.get(race.service);
    const cls = classes?.get(race.priority);
    cls?.delete(race);
    if (cls?.size === 0) classes!.delete(race.priority);
    if (classes?.size === 0) this.byClass.delete(race.service);
  }

  /** The races waiting for `service`. */
  forService(service: string): Iterable<R> {
    return this.byService.get(service) ?? [];
  }

  /**
   * The race still parked on `conn` for `service` that the execserver would serve first
   * among those at `minPriority` or above: the most urgent class, the oldest in it. Races
   * of a class are kept in acquisition order and nearly all are parked on every connection,
   * so each class's scan usually stops at its first.
   */
  firstParkedOn(conn: C, service: string, minPriority: number): R | undefined {
    let best: R | undefined;
    for (const [priority, races] of this.byClass.get(service) ?? []) {
      if (priority < minPriority || (best && priority <= best.priority)) continue;
      for (const race of races) {
        if (race.state !== "parked" || !race.parkedOn.has(conn)) continue;
        best = race;
        break;
      }
    }
    return best;
  }

  /**
   * Who takes an OFFER for `jobId` made on `conn`; undefined means DECLINE. None when the
   * want was UNWANTed there (`parkedAs` unset): the execserver withdraws that offer, so a
   * JOB would only be refused as stale, even while the race still waits elsewhere. Else its
   * own race while parked. Once that race is over, the offer is surplus but still good here.
   * Every instance serves a connection's oldest want, so their turns often land on the same
   * one; a DECLINE would cost this connection its turn and per-connection round-robin would
   * stop meaning equal slots per fylr. So the race parked on `conn` that the execserver
   * would serve next in that class or above takes the slot (the JOB still names the offered
   * job id, as the server expects).
   */
  takerOf(jobId: string, conn: C, parkedAs: ParkedAs | undefined): OfferTaker<R> | undefined {
    if (!parkedAs) return undefined;
    const own = this.byJob.get(jobId);
    if (own?.state === "parked") return { race: own, substitute: false };
    const other = this.firstParkedOn(conn, parkedAs.service, parkedAs.priority);
    return other && { race: other, substitute: true };
  }

  /** Every race in the book. */
  all(): Iterable<R> {
    return this.byJob.values();
  }
}
