import { isIP } from "node:net";
import * as tls from "node:tls";
import { splitHostPort } from "../../shared/config-parsing.js";
import { readTlsMaterial, type BrokerTlsOptions } from "./channel-setup.js";

// Alerts a server sends when it refuses the client's certificate (RFC 8446 §6.2).
const refusedClientCert = /certificate required|closed right after the handshake|alert unknown ca|alert bad certificate|alert certificate unknown|alert unsupported certificate|alert certificate (revoked|expired)|alert access denied/i;
// What this side says when it does not trust the server's certificate.
const untrustedServer = /self[- ]signed|unable to (verify|get)|Hostname\/IP does not match|certificate has expired|not yet valid|CERT_/i;

/**
 * Why a TLS connection to `address` fails, for the operator: grpc-js reports a refused
 * handshake as "Failed to connect" at best. One handshake of our own with the same files
 * (ALPN h2, as grpc-js) tells a refused client certificate from an untrusted server
 * certificate. Resolves undefined when the handshake works (the server then speaks first:
 * its HTTP/2 SETTINGS) or nothing is said within `timeoutMs`. A server that verifies the
 * client certificate after a TLS 1.3 handshake may close without an alert: a close before
 * the server's first bytes counts as that refusal.
 */
export function tlsHandshakeProblem(address: string, options: BrokerTlsOptions, timeoutMs = 3000): Promise<string | undefined> {
  const where = splitHostPort(address);
  if (!where) return Promise.resolve(undefined);
  let material;
  try {
    material = readTlsMaterial(options);
  } catch (err) {
    return Promise.resolve((err as Error).message);
  }
  const host = where.host.replace(/^\[|\]$/g, "");
  return new Promise((resolve) => {
    const socket = tls.connect({
      host,
      port: where.port,
      // SNI takes names only; an address is checked against the certificate's IP entries.
      ...(options.serverName ? { servername: options.serverName } : isIP(host) ? {} : { servername: host }),
      ...(material.ca ? { ca: material.ca } : {}),
      ...(material.cert && material.key ? { cert: material.cert, key: material.key } : {}),
      ALPNProtocols: ["h2"],
    });
    let done = false;
    const finish = (problem: string | undefined): void => {
      if (done) return;
      done = true;
      clearTimeout(timer);
      socket.destroy();
      resolve(problem);
    };
    const timer = setTimeout(() => finish(undefined), timeoutMs);
    let secured = false;
    socket.once("secureConnect", () => (secured = true));
    socket.once("data", () => finish(undefined));
    // on, not once: an error after the verdict (the socket torn down) must not go unhandled.
    socket.on("error", (err: Error) => finish(describeTlsProblem(address, err.message)));
    socket.once("close", () => finish(secured ? describeTlsProblem(address, "closed right after the handshake, before a byte was received") : undefined));
  });
}

/** A TLS error message with what to change in the fylr's config. */
export function describeTlsProblem(address: string, raw: string): string {
  const message = raw.replace(/\s+/g, " ").trim();
  if (refusedClientCert.test(message)) {
    return `the execserver at ${address} refused this fylr's TLS client certificate (${message}): execserver.tls.certFile and keyFile must name a certificate signed by a CA in the execserver's tls.clientCaFile`;
  }
  if (untrustedServer.test(message)) {
    return `this fylr does not trust the TLS certificate of the execserver at ${address} (${message}): check execserver.tls.caFile and serverName`;
  }
  return `TLS handshake with the execserver at ${address} failed: ${message}`;
}
