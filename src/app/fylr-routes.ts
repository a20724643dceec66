/**
 * The fylr's plain-HTTP routes next to Connect: /metrics for Prometheus and /status.json
 * for operators, `slotbroker status` and a status page (this fylr's stats, the queue by
 * state, the live fylrs, the execservers it reaches).
 */
import { toJson } from "@bufbuild/protobuf";
import type { Registry } from "prom-client";
import { StatsResponseSchema } from "../../gen/slotbroker/v1/queue_pb.js";
import { statsToProto, type Dispatcher } from "../dispatcher/index.js";
import { sendText, type BrokerClient, type RawRoute } from "../fylr/index.js";
import { renderWithRuntime } from "../shared/runtime-metrics.js";

/** GET /metrics, open like /healthz (figures, no items and no credentials): the fylr's families, then the process's runtime ones. */
export function metricsRoute(registry: Registry): RawRoute {
  return {
    path: "/metrics",
    methods: ["GET"],
    handle: async ({ res }) => {
      const body = await renderWithRuntime(registry);
      res.writeHead(200, { "content-type": registry.contentType }).end(body);
    },
  };
}

/** The body of GET /status.json. */
export interface FylrStatusJson {
  /** QueueService.Stats of this fylr, as protobuf JSON. */
  readonly stats: unknown;
  /** Unfinished items by kind and state, across all fylrs. */
  readonly queue: readonly { kind: string; state: string; count: number }[];
  /** Fairness keys with open items, most queued first (at most 20), and how many keys have queued items. */
  readonly keys?: { readonly top: readonly { key: string; queued: number; held: number }[]; readonly queuedKeys: number };
  /** Live fylrs and how many items each holds. */
  readonly fylrs: readonly { id: string; hostname: string; pid: number; apiUrl?: string; heartbeatAt: string; held: number }[];
  /** The configured execserver addresses and the instances reached through them. */
  readonly execservers: {
    readonly addresses: readonly string[];
    /** How each address is reached: "broker" streams, or "polling" its token protocol. */
    readonly transports: Readonly<Record<string, string>>;
    readonly instances: readonly {
      instanceId: string;
      address: string;
      capacity: number;
      clients: number;
      draining: boolean;
      transport: string;
    }[];
  };
}

/** GET /status.json. */
export function statusRoute(dispatcher: Dispatcher, broker: BrokerClient): RawRoute {
  return {
    path: "/status.json",
    methods: ["GET"],
    scope: "read",
    handle: async ({ res }) => {
      try {
        const body: FylrStatusJson = {
          stats: toJson(StatsResponseSchema, statsToProto(dispatcher.stats())),
          queue: await dispatcher.queue.countOpen(),
          keys: await dispatcher.queue.keyCounts(20).then(({ keys, keysQueued }) => ({
            top: keys.map((k) => ({ key: k.fairnessKey, queued: k.queued, held: k.held })),
            queuedKeys: keysQueued,
          })),
          fylrs: (await dispatcher.queue.listFylrs()).map((f) => ({
            id: f.id,
            hostname: f.hostname,
            pid: f.pid,
            apiUrl: f.apiUrl,
            heartbeatAt: f.heartbeatAt.toISOString(),
            held: f.held,
          })),
          execservers: {
            addresses: broker.config.addresses,
            transports: Object.fromEntries(broker.pools().map((p) => [p.address, p.transport])),
            instances: broker.instances().map((i) => ({
              instanceId: i.instanceId,
              address: i.address,
              capacity: i.processes,
              clients: i.clients,
              draining: i.draining,
              transport: i.transport,
            })),
          },
        };
        res.writeHead(200, { "content-type": "application/json" }).end(`${JSON.stringify(body, null, 2)}\n`);
      } catch (err) {
        sendText(res, 503, `status unavailable: ${(err as Error).message}`);
      }
    },
  };
}
