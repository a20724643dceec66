import { createHash, timingSafeEqual } from "node:crypto";
import type { Scope } from "./scopes.js";

/** One API token as configured: the secret itself, or only its SHA-256. */
export interface TokenEntry {
  /** Shown in logs and refusals instead of the token. */
  readonly name: string;
  /** The token, or undefined when only `sha256` is given. */
  readonly token?: string;
  /** SHA-256 of the token, lower-case hex; derived from `token` when that is given. */
  readonly sha256?: string;
  readonly scopes: readonly Scope[];
}

/** Who a credential belongs to, and what it may do. */
export interface Identity {
  /** The token's name, or the client certificate's rule name. */
  readonly name: string;
  /** "token" or "certificate". */
  readonly via: "token" | "certificate";
  readonly scopes: ReadonlySet<Scope>;
}

interface Held {
  readonly digest: Buffer;
  readonly identity: Identity;
}

/**
 * A set of API tokens, looked up by the SHA-256 of what a caller presents: every stored
 * digest is compared in constant time, none skipped after a match, so the answer time says
 * nothing about which token (or how much of one) matched. Tokens are never kept in clear.
 */
export class TokenSet {
  private readonly held: readonly Held[];

  /** Throws an Error naming the entry when two share a name or a token. */
  constructor(entries: readonly TokenEntry[]) {
    const names = new Map<string, string>();
    const digests = new Map<string, string>();
    this.held = entries.map((entry) => {
      const hex = entry.token === undefined ? entry.sha256?.toLowerCase() : tokenDigest(entry.token).toString("hex");
      if (!hex) throw new Error(`token "${entry.name}": give token or sha256`);
      if (names.has(entry.name)) throw new Error(`token "${entry.name}": the name is used twice`);
      const twin = digests.get(hex);
      if (twin !== undefined) throw new Error(`token "${entry.name}": the same token as "${twin}"`);
      names.set(entry.name, entry.name);
      digests.set(hex, entry.name);
      return { digest: Buffer.from(hex, "hex"), identity: { name: entry.name, via: "token", scopes: new Set(entry.scopes) } };
    });
  }

  /** How many tokens the set holds. */
  get size(): number {
    return this.held.length;
  }

  /** The tokens' names, for logs. */
  names(): string[] {
    return this.held.map((h) => h.identity.name);
  }

  /** The identity whose token `presented` is, or undefined. */
  find(presented: string): Identity | undefined {
    const digest = tokenDigest(presented);
    let found: Identity | undefined;
    for (const held of this.held) {
      if (timingSafeEqual(digest, held.digest)) found = held.identity;
    }
    return found;
  }
}

/** SHA-256 of a token: what `sha256:` in a token entry holds (`printf %s TOKEN | sha256sum`). */
export function tokenDigest(token: string): Buffer {
  return createHash("sha256").update(token, "utf8").digest();
}
