/**
 * QueueService over Connect (and gRPC, gRPC-Web): Submit, Get, Watch, Position, Stats.
 * Served by every fylr on its HTTP port; unary calls also work as JSON over HTTP/1.1.
 * Any fylr answers for any item: they share the database. Errors leave here as Connect
 * errors with the status code of the SlotbrokerError behind them, never as a 500.
 */
import { create } from "@bufbuild/protobuf";
import { Code, ConnectError, type ConnectRouter, type ServiceImpl } from "@connectrpc/connect";
import {
  type Item,
  GetResponseSchema,
  PositionResponseSchema,
  QueueService,
  SubmitResponseSchema,
  type SubmitRequest,
} from "../../gen/slotbroker/v1/queue_pb.js";
import { itemToProto, statsToProto, submitInputFromProto, type Dispatcher } from "../dispatcher/index.js";
import { toConnectError } from "../shared/errors.js";
import { silentLogger, type Logger } from "../shared/log.js";
import { getItem, snapshot } from "./item-view.js";
import type { ExecLoadSource } from "./position.js";
import type { RuntimeMeans } from "./runtime-means.js";
import { watchItem } from "./watch.js";

/** What QueueService is built from. */
export interface QueueApiOptions {
  readonly dispatcher: Dispatcher;
  /** The execservers' load per service, for the position of items not parked yet. */
  readonly load?: ExecLoadSource;
  /** This fylr's mean runtime per service, for ETA hints. */
  readonly means?: RuntimeMeans;
  /**
   * Services the connected execservers offer; undefined while none is connected. A submit
   * naming a service none of them offers is refused (with none connected, anything goes).
   */
  readonly offeredServices?: () => ReadonlySet<string> | undefined;
  /** Watch's database poll for items other fylrs run (default 500 ms). */
  readonly watchPollMs?: number;
  /** Aborted on shutdown: open Watch streams end with UNAVAILABLE. */
  readonly shutdown?: AbortSignal;
  readonly logger?: Logger;
}

/** Registers QueueService on a Connect router. */
export function registerQueueService(router: ConnectRouter, options: QueueApiOptions): void {
  router.service(QueueService, queueServiceImpl(options));
}

/** The QueueService implementation. */
export function queueServiceImpl(options: QueueApiOptions): ServiceImpl<typeof QueueService> {
  const { dispatcher } = options;
  const log = (options.logger ?? silentLogger).child({ component: "queue-api" });
  const guard = async <T>(what: string, fn: () => Promise<T>): Promise<T> => {
    try {
      return await fn();
    } catch (err) {
      const e = toConnectError(err);
      if (e.code === Code.Internal || e.code === Code.Unknown) log.error({ err, what }, "queue api call failed");
      throw e;
    }
  };
  return {
    submit: (req) =>
      guard("submit", async () => {
        checkServices(req, options.offeredServices?.());
        const { item, created } = await dispatcher.submit(submitInputFromProto(req));
        return create(SubmitResponseSchema, { item: withoutInlineStdin(itemToProto(item)), created });
      }),
    get: (req) => guard("get", async () => create(GetResponseSchema, { item: itemToProto(await getItem(dispatcher, req.id)) })),
    position: (req) => guard("position", async () => create(PositionResponseSchema, { position: (await snapshot(options, req.id)).position })),
    stats: () => guard("stats", () => Promise.resolve(statsToProto(dispatcher.stats()))),
    async *watch(req, ctx) {
      try {
        yield* watchItem(options, req.id, { signal: ctx.signal, shutdown: options.shutdown, pollMs: options.watchPollMs });
      } catch (err) {
        if (ctx.signal.aborted) return;
        throw toConnectError(err);
      }
    },
  };
}

// The caller just sent the inline stdin; echoing it would only cost serializing (and often
// compressing) it again. The case stays, so the answer still says where stdin comes from.
function withoutInlineStdin(item: Item): Item {
  for (const call of item.calls) if (call.stdin.case === "stdinData") call.stdin.value = noBytes;
  return item;
}
const noBytes = new Uint8Array(0);

// Fails fast instead of queueing an item no connected execserver could ever run.
function checkServices(req: SubmitRequest, offered: ReadonlySet<string> | undefined): void {
  if (!offered) return;
  req.calls.forEach((call, i) => {
    if (!call.service || offered.has(call.service)) return;
    const list = [...offered].sort().join(", ") || "none";
    throw new ConnectError(`calls[${i}].service: no connected execserver offers "${call.service}" (offered: ${list})`, Code.InvalidArgument);
  });
}
