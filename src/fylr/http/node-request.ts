import { createContextKey, createContextValues, type ContextValues } from "@connectrpc/connect";
import type { HttpRequest } from "./http-types.js";

/**
 * The Node request behind a Connect call. Handlers need it where Connect's abstraction
 * hides something: e.g. an HTTP/2 client reset ends the request body like a clean end.
 */
export const nodeRequestKey = createContextKey<HttpRequest | undefined>(undefined, { description: "node request" });

/** Context values carrying the Node request; the server's connect adapter installs this. */
export function nodeRequestContext(req: HttpRequest): ContextValues {
  return createContextValues().set(nodeRequestKey, req);
}
