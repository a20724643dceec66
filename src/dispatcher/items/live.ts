/**
 * The in-memory view of items this fylr is running: which phase each is in and the last
 * POSITION its execserver reported. Only this fylr knows it (the database says "claimed"
 * for an item both parked at an execserver and about to be), so QueueService merges it
 * into Get/Watch/Position answers. Watch streams follow single items (ItemFollowers).
 */
import type { Position } from "../../../gen/slotbroker/v1/broker_pb.js";
import { Transitions } from "../../shared/lifecycle.js";
import type { ItemKind } from "../types.js";

/**
 * An item's phase inside this fylr:
 * claimed → waiting (want parked for call N) → running (call N has a slot) → waiting (call
 * N+1) … → finishing (writing the outcome). Local items go claimed → running → finishing.
 */
export type LivePhase = "claimed" | "waiting" | "running" | "finishing";

const transitions = new Transitions<LivePhase>("live item phase", {
  claimed: ["waiting", "running", "finishing"],
  waiting: ["running", "finishing"],
  running: ["waiting", "finishing"],
  finishing: [],
});

/** One item this fylr holds. */
export interface LiveItem {
  readonly id: string;
  readonly kind: ItemKind;
  readonly priority: number;
  readonly lease: number;
  readonly phase: LivePhase;
  /** Exec items: the call being waited for or run (0-based) and how many there are. */
  readonly callIndex: number;
  readonly callCount: number;
  /** The service of the current call. */
  readonly service: string | undefined;
  /** The instance running the current call, once it started. */
  readonly instanceId: string | undefined;
  /** The last POSITION the execserver reported for the current call. */
  readonly position: Position | undefined;
  readonly claimedAt: Date;
  readonly phaseSince: Date;
}

/** A change: the item as it is now, or `removed` once this fylr let go of it. */
export type LiveListener = (item: LiveItem, removed: boolean) => void;

/**
 * The table of held items, with checked phase transitions; every change goes to `onChange`
 * (the dispatcher's "item:changed" event). Keyed by
 * item id; every update names the lease it is about, because after a requeue this fylr can
 * claim an item again while the task of its older claim is still winding down, and that
 * task must not touch the newer claim's entry.
 */
export class LiveItems {
  private readonly items = new Map<string, LiveItem>();

  constructor(private readonly onChange: LiveListener = () => undefined) {}

  /** Starts tracking a freshly claimed item. */
  add(init: Pick<LiveItem, "id" | "kind" | "priority" | "lease" | "callCount">): void {
    const now = new Date();
    this.put({ ...init, phase: "claimed", callIndex: 0, service: undefined, instanceId: undefined, position: undefined, claimedAt: now, phaseSince: now });
  }

  /** Moves an item to a new phase; throws on an illegal transition (a bug in the runner). */
  setPhase(id: string, lease: number, phase: LivePhase, patch: Partial<Pick<LiveItem, "callIndex" | "service" | "instanceId">> = {}): void {
    const item = this.current(id, lease);
    if (!item) return;
    if (item.phase !== phase) transitions.check(item.phase, phase);
    // A new call starts without the previous call's position or instance.
    const fresh = phase === "waiting" ? { position: undefined, instanceId: undefined } : {};
    this.put({ ...item, ...fresh, ...patch, phase, phaseSince: item.phase === phase ? item.phaseSince : new Date() });
  }

  /** Records the execserver's latest POSITION for an item. */
  setPosition(id: string, lease: number, position: Position): void {
    const item = this.current(id, lease);
    if (item) this.put({ ...item, position });
  }

  /** Stops tracking an item (if `lease` is still the claim tracked). */
  remove(id: string, lease: number): void {
    const item = this.current(id, lease);
    if (!item) return;
    this.items.delete(id);
    this.emit(item, true);
  }

  /** The item, if this fylr holds it. */
  get(id: string): LiveItem | undefined {
    return this.items.get(id);
  }

  /** All held items. */
  list(): LiveItem[] {
    return [...this.items.values()];
  }

  private current(id: string, lease: number): LiveItem | undefined {
    const item = this.items.get(id);
    return item?.lease === lease ? item : undefined;
  }

  private put(item: LiveItem): void {
    this.items.set(item.id, item);
    this.emit(item, false);
  }

  private emit(item: LiveItem, removed: boolean): void {
    this.onChange(item, removed);
  }
}

/**
 * Followers of single items (Watch streams), by item id: a notification naming 100 items
 * wakes the followers of those items, never a scan over every follower.
 */
export class ItemFollowers {
  private readonly byId = new Map<string, Set<() => void>>();

  constructor(private readonly onError: (err: unknown, id: string) => void) {}

  /** Adds `wake` for item `id`; returns the function that removes it. */
  add(id: string, wake: () => void): () => void {
    let set = this.byId.get(id);
    if (!set) this.byId.set(id, (set = new Set()));
    set.add(wake);
    return () => {
      set.delete(wake);
      if (set.size === 0 && this.byId.get(id) === set) this.byId.delete(id);
    };
  }

  /** Wakes the followers of `id`. */
  wake(id: string): void {
    const set = this.byId.get(id);
    if (!set) return;
    for (const wake of set) {
      try {
        wake();
      } catch (err) {
        this.onError(err, id);
      }
    }
  }

  /** Wakes every follower (notifications may have been missed). */
  wakeAll(): void {
    for (const id of this.byId.keys()) this.wake(id);
  }
}
