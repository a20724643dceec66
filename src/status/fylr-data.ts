/**
 * What the fylr status page shows, gathered: the dispatcher's admission and counters, the
 * broker's pools and instances (in memory), the open queue by state and priority, the live
 * fylrs and the items this fylr claimed last (from Postgres). Served as JSON at
 * /status/live.json and rendered by the pure fylr view. One snapshot is shared by every
 * viewer for `maxAgeMs`, so ten open pages cost the database what one does.
 */
import type { Dispatcher, ItemKind, ItemState } from "../dispatcher/index.js";
import { fromPgError } from "../dispatcher/index.js";
import type { Broker } from "../fylr/index.js";
import { itemsById, openItemsByPriority } from "./fylr-queries.js";

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
  readonly kind: ItemKind;
  readonly priority: number;
  /** The database state, or "unknown" when the row could not be read. */
  readonly state: ItemState | "unknown";
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
  readonly queue: readonly { kind: ItemKind; state: ItemState; priority: number; count: number }[];
  readonly fylrs: readonly { id: string; hostname: string; held: number; heartbeatAgeMs: number }[];
  readonly recent: readonly RecentItemJson[];
  /** Set when the database part could not be read. */
  readonly databaseError: string | undefined;
}

/** Options of FylrStatusSource. */
export interface FylrStatusSourceOptions {
  readonly dispatcher: Dispatcher;
  readonly broker: Broker;
  /** How long one snapshot is served (default 500 ms). */
  readonly maxAgeMs?: number;
  /** How many recently claimed items to show (default 12). */
  readonly recent?: number;
}

// What the live view told about a recent item (kept after the item left it).
interface Seen {
  readonly kind: ItemKind;
  readonly priority: number;
  readonly service: string | undefined;
  readonly instanceId: string | undefined;
}

interface ItemRow {
  id: string;
  kind: ItemKind;
  priority: number;
  state: ItemState;
  attempts: number;
  claimed_by: string | null;
  updated_at: Date;
  error: string | null;
}

/** Collects FylrPageData; `close()` stops following the dispatcher. */
export class FylrStatusSource {
  private readonly startedAt = new Date();
  // Insertion-ordered: re-inserting moves an id to the end, so the tail is the latest.
  private readonly recentIds = new Map<string, Seen>();
  private readonly unsubscribe: () => void;
  private cached: { at: number; data: Promise<FylrPageData> } | undefined;

  constructor(private readonly options: FylrStatusSourceOptions) {
    const keep = options.recent ?? 12;
    this.unsubscribe = options.dispatcher.subscribe((item) => {
      const prev = this.recentIds.get(item.id);
      const seen = { kind: item.kind, priority: item.priority, service: item.service ?? prev?.service, instanceId: item.instanceId ?? prev?.instanceId };
      // A fresh claim moves the item to the end; later phases update it in place.
      if (!prev || item.phase === "claimed") this.recentIds.delete(item.id);
      this.recentIds.set(item.id, seen);
      if (this.recentIds.size > keep) this.recentIds.delete(this.recentIds.keys().next().value!);
    });
  }

  /** The latest snapshot (at most maxAgeMs old). */
  snapshot(): Promise<FylrPageData> {
    const now = Date.now();
    if (!this.cached || now - this.cached.at >= (this.options.maxAgeMs ?? 500)) this.cached = { at: now, data: this.collect(new Date(now)) };
    return this.cached.data;
  }

  /** Stops following the dispatcher. */
  close(): void {
    this.unsubscribe();
  }

  private async collect(at: Date): Promise<FylrPageData> {
    const { dispatcher, broker } = this.options;
    const stats = dispatcher.stats();
    const memory = {
      at: at.toISOString(),
      fylrId: stats.fylrId,
      startedAt: this.startedAt.toISOString(),
      dispatcher: {
        state: stats.state,
        execHeld: stats.execHeld,
        execAdmission: stats.execAdmission,
        headroom: dispatcher.config.headroom,
        localRunning: stats.localRunning,
        localCapacity: stats.localCapacity,
        localReservedForHigh: stats.localReservedForHigh,
        counters: { ...stats.counters },
      },
      shares: stats.shares.map((s) => ({ instanceId: s.instanceId, address: s.address, capacity: s.capacity, clients: s.clients, share: s.share })),
      instances: broker.instances().map((i) => ({ instanceId: i.instanceId, address: i.address, processes: i.processes, clients: i.clients, draining: i.draining })),
      pools: broker.pools().map((p) => ({
        address: p.address,
        covered: p.covered,
        ...p.stats,
        connections: p.connections().map((c) => ({
          name: c.name,
          state: c.state,
          instanceId: c.instanceId,
          rttMs: c.rttMs,
          parked: c.parkedCount,
          running: c.runningCount,
        })),
      })),
      wants: { parked: broker.parked, running: broker.running },
    };
    try {
      const [queue, fylrs, recent] = await Promise.all([this.queue(), dispatcher.store.listFylrs(), this.recent()]);
      const heartbeatAgeMs = (d: Date): number => Math.max(0, at.getTime() - d.getTime());
      return {
        ...memory,
        queue,
        fylrs: fylrs.map((f) => ({ id: f.id, hostname: f.hostname, held: f.held, heartbeatAgeMs: heartbeatAgeMs(f.heartbeatAt) })),
        recent,
        databaseError: undefined,
      };
    } catch (err) {
      return { ...memory, queue: [], fylrs: [], recent: this.recentFromMemory(new Map()), databaseError: errorMessage(fromPgError(err, "status page")) };
    }
  }

  private async queue(): Promise<FylrPageData["queue"]> {
    type Row = { kind: ItemKind; state: ItemState; priority: number; n: number };
    const rows = (await this.options.dispatcher.store.pool.query<Row>(openItemsByPriority)).rows;
    return rows.map((r) => ({ kind: r.kind, state: r.state, priority: r.priority, count: r.n }));
  }

  private async recent(): Promise<RecentItemJson[]> {
    const ids = [...this.recentIds.keys()];
    if (ids.length === 0) return [];
    const rows = (await this.options.dispatcher.store.pool.query<ItemRow>(itemsById, [ids])).rows;
    return this.recentFromMemory(new Map(rows.map((r) => [r.id, r])));
  }

  // Newest first; the database row when there is one, the live view on top.
  private recentFromMemory(rows: ReadonlyMap<string, ItemRow>): RecentItemJson[] {
    return [...this.recentIds]
      .reverse()
      .map(([id, seen]) => {
        const row = rows.get(id);
        const live = this.options.dispatcher.liveItem(id);
        return {
          id,
          kind: row?.kind ?? seen.kind,
          priority: row?.priority ?? seen.priority,
          state: row?.state ?? "unknown",
          attempts: row?.attempts ?? 0,
          claimedBy: row?.claimed_by ?? undefined,
          updatedAt: row?.updated_at.toISOString(),
          error: row?.error ?? undefined,
          phase: live?.phase,
          service: live?.service ?? seen.service,
          instanceId: live?.instanceId ?? seen.instanceId,
        };
      });
  }
}

function errorMessage(err: unknown): string {
  return err instanceof Error ? err.message : String(err);
}
