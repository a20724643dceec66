/**
 * QueueService over Connect (and gRPC, gRPC-Web): Submit, Get, Watch, Position, Stats,
 * History, and control over items: Cancel, List, Retry, Delete.
 * Served by every fylr on its HTTP port; unary calls also work as JSON over HTTP/1.1.
 * Any fylr answers for any item: they share the database. Errors leave here as Connect
 * errors with the status code of the SlotbrokerError behind them, never as a 500.
 */
import { create, type MessageInitShape } from "@bufbuild/protobuf";
import { Code, ConnectError, type ConnectRouter, type ServiceImpl } from "@connectrpc/connect";
import {
  CancelResponseSchema,
  DeleteResponseSchema,
  type Item,
  GetResponseSchema,
  ListResponseSchema,
  KeyCountSchema,
  ListKeysResponseSchema,
  RetryResponseSchema,
  PositionResponseSchema,
  QueueService,
  type ListRequest,
  type SubmitRequest,
  type SubmitResponseSchema,
} from "../../gen/slotbroker/v1/queue_pb.js";
import { timestampDate, timestampFromDate } from "@bufbuild/protobuf/wkt";
import { historyToProto, itemStateFromProto, itemToBinary, itemToProto, statsToProto, submitInputFromProto, submitRequestFromBinary, type Dispatcher, type ItemState, type ListFilter, type QueueItem } from "../dispatcher/index.js";
import { toConnectError } from "../shared/errors.js";
import { silentLogger, type Logger } from "../shared/log.js";
import { binaryAnswer, binaryRequests, varintSize, writeLengthPrefix, type BinaryAnswer } from "../shared/protobuf-wire.js";
import { tracing } from "../shared/tracing/index.js";
import { getItem, snapshot } from "./item-view.js";
import type { ExecLoadSource } from "./position.js";
import type { RuntimeMeans } from "./runtime-means.js";
import { tracedSubmit } from "./submit-trace.js";
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
  /**
   * The env names a service allows on the connected execservers; undefined when unknown
   * (then anything goes, and an execserver refuses a bad name at run time).
   */
  readonly allowedEnv?: (service: string) => ReadonlySet<string> | undefined;
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
  const impl: ServiceImpl<typeof QueueService> = {
    submit: (req, ctx) =>
      guard("submit", async () => {
        checkServices(req, options.offeredServices?.());
        if (options.allowedEnv) checkEnv(req, options.allowedEnv);
        const input = submitInputFromProto(req);
        // The request's headers are only looked at (and built, on the direct path) when traces are on.
        const { item, created } = tracing.on ? await tracedSubmit(dispatcher, input, ctx.requestHeader.get("traceparent")) : await dispatcher.submit(input);
        return submitAnswer(item, created);
      }),
    get: (req) => guard("get", async () => create(GetResponseSchema, { item: itemToProto(await getItem(dispatcher, req.id)) })),
    position: (req) => guard("position", async () => create(PositionResponseSchema, { position: (await snapshot(options, req.id)).position })),
    stats: () => guard("stats", () => Promise.resolve(statsToProto(dispatcher.stats()))),
    cancel: (req) =>
      guard("cancel", async () => {
        const { item, previous } = await dispatcher.cancel(req.id);
        if (previous !== "cancelled") log.info({ itemId: item.id, previous, state: item.state }, "item cancel asked");
        return create(CancelResponseSchema, { item: itemToProto(item) });
      }),
    list: (req) =>
      guard("list", async () => {
        const page = await dispatcher.list(listFilterFromProto(req));
        return create(ListResponseSchema, { items: page.items.map(itemToProto), nextPageToken: page.nextPageToken });
      }),
    history: (req) => guard("history", async () => historyToProto(await dispatcher.history(req.id))),
    listKeys: (req) =>
      guard("list keys", async () => {
        const { keys, keysQueued } = await dispatcher.queue.keyCounts(Math.min(Math.max(req.limit || 50, 1), 500));
        return create(ListKeysResponseSchema, {
          keysQueued,
          keys: keys.map((k) =>
            create(KeyCountSchema, { fairnessKey: k.fairnessKey, queued: k.queued, held: k.held, oldestQueued: k.oldestQueued && timestampFromDate(k.oldestQueued) }),
          ),
        });
      }),
    retry: (req) => guard("retry", async () => create(RetryResponseSchema, { item: itemToProto(await dispatcher.retry(req.id)) })),
    delete: (req) =>
      guard("delete", async () => {
        const { blobs } = await dispatcher.delete(req.id);
        return create(DeleteResponseSchema, { blobsDeleted: blobs });
      }),
    async *watch(req, ctx) {
      try {
        yield* watchItem(options, req.id, { signal: ctx.signal, shutdown: options.shutdown, pollMs: options.watchPollMs });
      } catch (err) {
        if (ctx.signal.aborted) return;
        throw toConnectError(err);
      }
    },
  };
  // The direct unary path reads a binary Submit by hand.
  return Object.assign(impl, { [binaryRequests]: { submit: submitRequestFromBinary } });
}

/** A ListRequest as the dispatcher's filter; INVALID_ARGUMENT for an unknown state. */
export function listFilterFromProto(req: ListRequest): ListFilter {
  const states = req.states.map((s, i): ItemState => {
    const state = itemStateFromProto(s);
    if (!state) throw new ConnectError(`states[${i}]: not an item state: ${s}`, Code.InvalidArgument);
    return state;
  });
  const key = req.fairnessKey;
  if (key !== undefined && (Buffer.byteLength(key, "utf8") > 128 || key.includes("\0"))) {
    throw new ConnectError("fairness_key: at most 128 bytes of UTF-8, no NUL character", Code.InvalidArgument);
  }
  return {
    states,
    service: req.service || undefined,
    minPriority: req.minPriority,
    maxPriority: req.maxPriority,
    fairnessKey: req.fairnessKey,
    createdAfter: req.createdAfter && timestampDate(req.createdAfter),
    createdBefore: req.createdBefore && timestampDate(req.createdBefore),
    pageSize: req.pageSize,
    pageToken: req.pageToken || undefined,
  };
}
// A Submit's answer; its Item message is built only when asked for: the direct path takes
// the bytes instead. Both leave out the inline stdin (see withoutInlineStdin).
function submitAnswer(item: QueueItem, created: boolean): MessageInitShape<typeof SubmitResponseSchema> & BinaryAnswer {
  return {
    get item() {
      return withoutInlineStdin(itemToProto(item));
    },
    created,
    [binaryAnswer]: () => {
      const bytes = itemToBinary(item, true);
      if (!bytes) return undefined;
      // SubmitResponse: item (field 1) and created (field 2, left out when false).
      const out = Buffer.allocUnsafe(1 + varintSize(bytes.byteLength) + bytes.byteLength + (created ? 2 : 0));
      let at = writeLengthPrefix(out, 0, 0x0a, bytes.byteLength);
      at += bytes.copy(out, at);
      if (created) out.set([0x10, 1], at);
      return out;
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

// An env name the service does not allow would be refused by the execserver at run time,
// after a slot was taken, on every attempt: refused here instead.
function checkEnv(req: SubmitRequest, allowedEnv: (service: string) => ReadonlySet<string> | undefined): void {
  req.calls.forEach((call, i) => {
    const names = Object.keys(call.env);
    if (names.length === 0) return;
    const allowed = allowedEnv(call.service);
    if (!allowed) return;
    // A malformed name is left to the dispatcher's own check, which names it as such.
    const bad = names.find((name) => !allowed.has(name) && /^[A-Za-z_][A-Za-z0-9_]*$/.test(name));
    if (bad === undefined) return;
    const list = [...allowed].sort().join(", ") || "none";
    throw new ConnectError(`calls[${i}].env: "${bad.slice(0, 64)}" is not allowed for service ${call.service} (allowed: ${list})`, Code.InvalidArgument);
  });
}
