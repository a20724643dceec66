import type * as http from "node:http";
import type * as http2 from "node:http2";
import type { Logger } from "../../shared/log.js";

/** A request from either protocol (the http2 compatibility API mirrors http's). */
export type HttpRequest = http.IncomingMessage | http2.Http2ServerRequest;

/** A response for either protocol. */
export type HttpResponse = http.ServerResponse | http2.Http2ServerResponse;

/** One request handed to a raw route. */
export interface RawCall {
  readonly req: HttpRequest;
  readonly res: HttpResponse;
  /** Values of the route's ":name" path segments (URL-decoded). */
  readonly params: Readonly<Record<string, string>>;
  /** True when the client waits for "100 Continue" before sending its body. */
  readonly expectContinue: boolean;
  readonly logger: Logger;
}

/**
 * A plain-HTTP route next to the Connect routes, for native tools and operators.
 * `path` is literal segments plus ":name" placeholders, e.g. "/pipe/in/:id".
 */
export interface RawRoute {
  readonly path: string;
  /** Allowed methods; any other method on a matching path answers 405. */
  readonly methods: readonly string[];
  /** When true the handler sends "100 Continue" itself, after deciding to take the body. */
  readonly handlesContinue?: boolean;
  /** The scope a caller needs when the server has access control; undefined: open to all. */
  readonly scope?: string;
  readonly handle: (call: RawCall) => void | Promise<void>;
}

/** Why a request was refused: no usable credential, or one without the scope needed. */
export interface AccessRefusal {
  readonly code: "unauthenticated" | "permission_denied";
  /** Names what was wrong; never contains a credential. */
  readonly message: string;
}

/** Decides, as a request starts, whether its caller holds `scope`. */
export interface AccessControl {
  check(req: HttpRequest, scope: string): AccessRefusal | undefined;
}
