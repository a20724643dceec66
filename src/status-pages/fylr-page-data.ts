/**
 * What the fylr status page shows: one snapshot of the dispatcher's admission and counters,
 * the broker client's pools and instances, the open queue, the live fylrs and the items
 * this fylr claimed last. Served as JSON at /status/live.json and drawn by the pure fylr
 * view. Plain data: whoever gathers it (the fylr's assembly) fills it in.
 */

/** Where an item runs, as the queue stores it. */
export type ItemKindJson = "exec" | "local";

/** An item's state, as the queue stores it. */
export type ItemStateJson = "queued" | "claimed" | "running" | "succeeded" | "failed" | "cancelled";

/** One instance share as the dispatcher computed it. */
export interface ShareJson {
  readonly instanceId: string;
  readonly address: string;
  readonly capacity: number;
  readonly clients: number;
  readonly share: number;
}

/** One broker connection of a pool. */
export interface PoolConnectionJson {
  readonly name: string;
  readonly state: string;
  readonly instanceId: string | undefined;
  readonly rttMs: number | undefined;
  readonly parked: number;
  readonly running: number;
}

/** One configured execserver address and its connections. */
export interface PoolJson {
  readonly address: string;
  readonly covered: boolean;
  readonly opened: number;
  readonly grown: number;
  readonly duplicatesClosed: number;
  readonly connections: readonly PoolConnectionJson[];
}

/** One item this fylr claimed recently, as the database and the live view know it. */
export interface RecentItemJson {
  readonly id: string;
  readonly kind: ItemKindJson;
  readonly priority: number;
  /** The fairness key ("" the default key); undefined when the row could not be read. */
  readonly fairnessKey: string | undefined;
  /** The database state, or "unknown" when the row could not be read. */
  readonly state: ItemStateJson | "unknown";
  readonly attempts: number;
  readonly claimedBy: string | undefined;
  readonly updatedAt: string | undefined;
  readonly error: string | undefined;
  /** This fylr's live phase while it holds the item. */
  readonly phase: string | undefined;
  readonly service: string | undefined;
  readonly instanceId: string | undefined;
}

/** The body of /status/live.json. */
export interface FylrPageData {
  readonly at: string;
  readonly fylrId: string;
  readonly startedAt: string;
  readonly dispatcher: {
    readonly state: string;
    readonly execHeld: number;
    readonly execAdmission: number;
    readonly headroom: number;
    readonly localRunning: number;
    readonly localCapacity: number;
    readonly localReservedForHigh: number;
    readonly counters: Readonly<Record<string, number>>;
  };
  readonly shares: readonly ShareJson[];
  readonly instances: readonly { instanceId: string; address: string; processes: number; clients: number; draining: boolean }[];
  readonly pools: readonly PoolJson[];
  readonly wants: { readonly parked: number; readonly running: number };
  /** Open items of all fylrs; empty when the database did not answer (see databaseError). */
  readonly queue: readonly { kind: ItemKindJson; state: ItemStateJson; priority: number; count: number }[];
  readonly fylrs: readonly { id: string; hostname: string; held: number; heartbeatAgeMs: number }[];
  /** Fairness keys with open items of all fylrs, most queued first (a dozen), and how many keys have queued items. */
  readonly keys?: { readonly top: readonly { key: string; queued: number; held: number }[]; readonly queuedKeys: number };
  readonly recent: readonly RecentItemJson[];
  /** Set when the database part could not be read. */
  readonly databaseError: string | undefined;
}
