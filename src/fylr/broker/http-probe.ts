import http from "node:http";
import https from "node:https";
import { endpointTls } from "../legacy/token-http.js";

/**
 * True when a plain HTTP/1.x server answers at `url` (any status): positive evidence that
 * an address which failed a gRPC call is an old execserver rather than a dead one. A gRPC
 * server (HTTP/2 only), a refused connection or silence within `timeoutMs` give false.
 */
export function answersHttp1(url: URL, timeoutMs = 2000, tls: { ca?: Buffer; cert?: Buffer; key?: Buffer } = {}): Promise<boolean> {
  return new Promise((resolve) => {
    const send = url.protocol === "https:" ? https.request : http.request;
    const req = send(url, { method: "GET", agent: false, timeout: timeoutMs, ...endpointTls(url, tls) }, (res) => {
      res.resume();
      req.destroy();
      resolve(true);
    });
    req.on("timeout", () => req.destroy());
    req.on("error", () => resolve(false));
    req.end();
  });
}
