/**
 * Gathers the fylr status page's snapshot from the dispatcher (admission, counters, its
 * named queries for the open queue, the live fylrs and recent items) and the broker client
 * (pools, instances). One snapshot is shared by every viewer for `maxAgeMs`, so ten open
 * pages cost the database what one does.
 */
import type { Dispatcher, ItemSummary, QueueItem } from "../dispatcher/index.js";
import type { BrokerClient } from "../fylr/index.js";
import type { FylrPageData, ItemKindJson, RecentItemJson } from "../status-pages/index.js";

/** Options of FylrStatusSource. */
export interface FylrStatusSourceOptions {
  readonly dispatcher: Dispatcher;
  readonly broker: BrokerClient;
  /** How long one snapshot is served (default 500 ms). */
  readonly maxAgeMs?: number;
  /** How many recently claimed items to show (default 12). */
  readonly recent?: number;
}

// What the live view told about a recent item (kept after the item left it).
interface Seen {
  readonly kind: ItemKindJson;
  readonly priority: number;
  readonly service: string | undefined;
  readonly instanceId: string | undefined;
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
    this.unsubscribe = options.dispatcher.events.on("item:changed", (item) => {
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
      const [queue, fylrs, recent, waiting, keys] = await Promise.all([
        dispatcher.queue.openItemsByPriority(),
        dispatcher.queue.listFylrs(),
        dispatcher.queue.itemSummaries([...this.recentIds.keys()]),
        // The newest queued items too, so they can be cancelled from the page.
        dispatcher.list({ states: ["queued"], pageSize: queuedShown }),
        dispatcher.queue.keyCounts(keysShown),
      ]);
      const heartbeatAgeMs = (d: Date): number => Math.max(0, at.getTime() - d.getTime());
      return {
        ...memory,
        queue,
        fylrs: fylrs.map((f) => ({ id: f.id, hostname: f.hostname, held: f.held, heartbeatAgeMs: heartbeatAgeMs(f.heartbeatAt) })),
        keys: { top: keys.keys.map((k) => ({ key: k.fairnessKey, queued: k.queued, held: k.held })), queuedKeys: keys.keysQueued },
        recent: [
          ...this.recentFromMemory(new Map(recent.map((r) => [r.id, r]))),
          ...waiting.items.filter((item) => !this.recentIds.has(item.id)).map(queuedRow),
        ],
        databaseError: undefined,
      };
    } catch (err) {
      // The queue store's errors are already translated (and name the query).
      return { ...memory, queue: [], fylrs: [], recent: this.recentFromMemory(new Map()), databaseError: err instanceof Error ? err.message : String(err) };
    }
  }

  // Newest first; the database row when there is one, the live view on top.
  private recentFromMemory(rows: ReadonlyMap<string, ItemSummary>): RecentItemJson[] {
    return [...this.recentIds].reverse().map(([id, seen]) => {
      const row = rows.get(id);
      const live = this.options.dispatcher.liveItem(id);
      return {
        id,
        kind: row?.kind ?? seen.kind,
        priority: row?.priority ?? seen.priority,
        fairnessKey: row?.fairnessKey,
        state: row?.state ?? "unknown",
        attempts: row?.attempts ?? 0,
        claimedBy: row?.claimedBy,
        updatedAt: row?.updatedAt.toISOString(),
        error: row?.error,
        phase: live?.phase,
        service: live?.service ?? seen.service,
        instanceId: live?.instanceId ?? seen.instanceId,
      };
    });
  }
}

/** How many of the newest queued items the page lists. */
const queuedShown = 5;
/** How many fairness keys (most queued first) the page shows. */
const keysShown = 12;

function queuedRow(item: QueueItem): RecentItemJson {
  return {
    id: item.id,
    kind: item.kind,
    priority: item.priority,
    fairnessKey: item.fairnessKey,
    state: item.state,
    attempts: item.attempts,
    claimedBy: undefined,
    updatedAt: item.updatedAt.toISOString(),
    error: item.error,
    phase: undefined,
    service: item.calls[0]?.service ?? item.local?.name,
    instanceId: undefined,
  };
}
