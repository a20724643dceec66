/**
 * A QueueService client for the CLI and tests: Connect over HTTP/1.1 (what the fylr serves
 * to curl as well), and following an item to its end through Watch — watching again when a
 * stream drops (a fylr restarting; any fylr answers for any item).
 */
import { Code, ConnectError, createClient, type Client } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-node";
import { ItemState, QueueService, type Item, type WatchResponse } from "../../gen/slotbroker/v1/queue_pb.js";
import { sleep } from "../shared/abort.js";

/** A QueueService client. */
export type QueueClient = Client<typeof QueueService>;

/** How a client proves who it is to a fylr, and whom it trusts over https. */
export interface ApiCredentials {
  /** Sent as `authorization: Bearer TOKEN` on every call. */
  readonly token?: string;
  /** CA certificates to trust for an https fylr (default: the system's). */
  readonly ca?: Buffer;
  /** A client certificate and its key, for a fylr that maps certificates to scopes. */
  readonly cert?: Buffer;
  readonly key?: Buffer;
}

/** The `authorization` header for `credentials`, when they hold a token. */
export function authorizationHeaders(credentials: ApiCredentials): Record<string, string> {
  return credentials.token === undefined ? {} : { authorization: `Bearer ${credentials.token}` };
}

/** TLS options of node:https for `credentials` (only what they set). */
export function tlsOptions(credentials: ApiCredentials): { ca?: Buffer; cert?: Buffer; key?: Buffer } {
  const { ca, cert, key } = credentials;
  return { ...(ca && { ca }), ...(cert && { cert }), ...(key && { key }) };
}

/** A client for the fylr at `baseUrl` ("http://host:port" or "https://…"). */
export function createQueueClient(baseUrl: string, credentials: ApiCredentials = {}): QueueClient {
  const headers = authorizationHeaders(credentials);
  const transport = createConnectTransport({
    baseUrl,
    httpVersion: "1.1",
    nodeOptions: tlsOptions(credentials),
    interceptors: [
      (next) => (req) => {
        for (const [name, value] of Object.entries(headers)) req.header.set(name, value);
        return next(req);
      },
    ],
  });
  return createClient(QueueService, transport);
}

/** True for an item in SUCCEEDED, FAILED or CANCELLED. */
export function itemFinished(item: Item | undefined): boolean {
  return item?.state === ItemState.SUCCEEDED || item?.state === ItemState.FAILED || item?.state === ItemState.CANCELLED;
}

/** Options of followItem. */
export interface FollowOptions {
  /** Called with every Watch update. */
  readonly onUpdate?: (update: WatchResponse) => void;
  /** Called when the stream dropped and is watched again after a pause. */
  readonly onRetry?: (err: ConnectError, attempt: number) => void;
  readonly signal?: AbortSignal;
  /** Re-watches in a row before giving up (default 30, one a second). */
  readonly retries?: number;
  readonly retryDelayMs?: number;
}

/** Follows an item until it finished and resolves with it. NOT_FOUND and bad ids fail at once. */
export async function followItem(client: QueueClient, id: string, options: FollowOptions = {}): Promise<Item> {
  const retries = options.retries ?? 30;
  let failures = 0;
  for (;;) {
    // Leaving the stream at the end state, before the server's end of it was read, leaves
    // the HTTP/1.1 request open: its socket would keep a CLI alive until the server's
    // keep-alive timeout (5 s). Aborting closes it.
    const done = new AbortController();
    const signal = options.signal ? AbortSignal.any([options.signal, done.signal]) : done.signal;
    try {
      for await (const update of client.watch({ id }, { signal })) {
        failures = 0;
        options.onUpdate?.(update);
        if (update.item && itemFinished(update.item)) return update.item;
      }
      // The stream ended without the end state (it should not): ask directly.
      const { item } = await client.get({ id }, { signal: options.signal });
      if (item && itemFinished(item)) return item;
    } catch (err) {
      options.signal?.throwIfAborted();
      const e = ConnectError.from(err);
      if (e.code === Code.NotFound || e.code === Code.InvalidArgument || ++failures > retries) throw e;
      options.onRetry?.(e, failures);
      await sleep(options.retryDelayMs ?? 1000, options.signal);
    } finally {
      done.abort();
    }
  }
}
