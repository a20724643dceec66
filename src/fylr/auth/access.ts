import type { TLSSocket } from "node:tls";
import type { AccessControl, AccessRefusal, HttpRequest } from "../http/http-types.js";
import { describeCertificate, matchClientRules, type ClientRule } from "./client-certs.js";
import { allows, type Scope } from "./scopes.js";
import type { Identity, TokenSet } from "./token-set.js";

/**
 * The fylr's API credentials: bearer tokens (also as the password of HTTP Basic, for
 * browsers) and, over TLS with a client CA, verified client certificates mapped to scopes
 * by `rules`. A presented token wins over a certificate: a wrong token is refused even on
 * a connection whose certificate would do. The token set can be replaced at any time; a
 * call is judged once, as it starts.
 */
export class ApiAccess implements AccessControl {
  private tokens: TokenSet;
  // A connection's certificate never changes: judged once per TLS socket.
  private readonly byConnection = new WeakMap<object, Identity | AccessRefusal | undefined>();

  constructor(
    tokens: TokenSet,
    private readonly rules: readonly ClientRule[] = [],
  ) {
    this.tokens = tokens;
  }

  /** Rotation: calls that start from now on are judged by `tokens`. */
  replaceTokens(tokens: TokenSet): void {
    this.tokens = tokens;
  }

  /** The tokens calls are judged by now. */
  get currentTokens(): TokenSet {
    return this.tokens;
  }

  /** @inheritdoc */
  check(req: HttpRequest, scope: string): AccessRefusal | undefined {
    const who = this.identify(req);
    if ("code" in who) return who;
    if (allows(who.scopes, scope as Scope)) return undefined;
    const held = [...who.scopes].sort().join(", ") || "no scopes";
    const what = who.via === "token" ? `token "${who.name}"` : `client certificate ${who.name}`;
    return { code: "permission_denied", message: `${what} has ${held}; this call needs the ${scope} scope` };
  }

  /** Who sent the request, or why nobody can be told. */
  identify(req: HttpRequest): Identity | AccessRefusal {
    const header = req.headers.authorization;
    if (header !== undefined) return this.fromHeader(header);
    const socket = req.socket as Partial<TLSSocket> | undefined;
    if (typeof socket?.getPeerCertificate !== "function") return noCredential;
    const key = socket as object;
    if (!this.byConnection.has(key)) this.byConnection.set(key, this.fromCertificate(socket as TLSSocket));
    return this.byConnection.get(key) ?? noCredential;
  }

  private fromHeader(header: string): Identity | AccessRefusal {
    const bearer = /^bearer +(\S+) *$/i.exec(header);
    const basic = bearer ? undefined : /^basic +([A-Za-z0-9+/=]+) *$/i.exec(header);
    if (!bearer && !basic) {
      return { code: "unauthenticated", message: 'authorization: expected "Bearer TOKEN" (or HTTP Basic with the token as the password)' };
    }
    let token = bearer?.[1];
    if (basic) {
      const pair = Buffer.from(basic[1]!, "base64").toString("utf8");
      token = pair.slice(pair.indexOf(":") + 1);
    }
    return this.tokens.find(token!) ?? unknownToken;
  }

  private fromCertificate(socket: TLSSocket): Identity | AccessRefusal | undefined {
    const cert = socket.getPeerCertificate();
    if (!cert || Object.keys(cert).length === 0) return undefined;
    if (!socket.authorized) {
      return { code: "unauthenticated", message: `client certificate ${describeCertificate(cert)} was not accepted (${String(socket.authorizationError)})` };
    }
    return matchClientRules(this.rules, cert) ?? { name: describeCertificate(cert), via: "certificate", scopes: new Set() };
  }
}

const noCredential: AccessRefusal = {
  code: "unauthenticated",
  message: "no credential: this fylr's API needs a token (authorization: Bearer TOKEN) or a client certificate",
};

const unknownToken: AccessRefusal = {
  code: "unauthenticated",
  message: "unknown token: it is none of this fylr's API tokens (a rotated-out token is refused too)",
};
