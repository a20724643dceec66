/**
 * The `auth` and `tls` sections of a fylr config: who may use the fylr's API, and TLS on
 * its HTTP port.
 *
 *   auth:
 *     tokens: [{ name: ci, token: "…", scopes: [submit, read] }]   # or sha256: instead of token
 *     tokensFile: /etc/slotbroker/api-tokens.yaml                  # re-read on change and SIGHUP
 *     reloadInterval: 5s
 *     clients: [{ subject: ops.example.com, scopes: [admin] }]     # verified client certificates
 *   tls: { certFile, keyFile, clientCaFile }
 */
import { z } from "zod";
import { durationMs, isLoopbackHost, splitHostPort } from "../../shared/config-parsing.js";
import { ConfigError } from "../../shared/errors.js";
import type { ClientRule } from "./client-certs.js";
import { scopes as scopeNames, type Scope } from "./scopes.js";
import { TokenSet, type TokenEntry } from "./token-set.js";

const scopeList = z.array(z.enum(scopeNames as [Scope, ...Scope[]])).min(1, "give at least one scope (read, submit, admin)");

/** One API token in the config or the tokens file. */
export const tokenEntrySchema = z
  .strictObject({
    /** Shown in logs and refusals instead of the token. */
    name: z.string().regex(/^[A-Za-z0-9][A-Za-z0-9._@-]{0,63}$/, "expected letters, digits, '.', '_', '@' or '-' (at most 64)"),
    token: z
      .string()
      .regex(/^[\x21-\x7e]+$/, "expected visible ASCII characters, no spaces")
      .min(16, "at least 16 characters (e.g. openssl rand -hex 32)")
      .max(4096)
      .optional(),
    /** SHA-256 of the token in hex, so the file need not hold the token itself. */
    sha256: z.string().regex(/^[0-9a-fA-F]{64}$/, "expected 64 hex digits (printf %s TOKEN | sha256sum)").optional(),
    scopes: scopeList,
  })
  .refine((e) => (e.token === undefined) !== (e.sha256 === undefined), { message: 'give either "token" or "sha256"' });

/** The `auth` section. */
export const apiAuthSchema = z.strictObject({
  /** Tokens written into the config (or SLOTBROKER_API_TOKENS as JSON). */
  tokens: z.array(tokenEntrySchema).default([]),
  /** A YAML file `tokens: [...]` re-read while the fylr runs: rotation without a restart. */
  tokensFile: z.string().min(1).optional(),
  /** How often the tokens file is looked at; 0s: only on SIGHUP. */
  reloadInterval: durationMs.prefault("5s"),
  /** Verified client certificates (tls.clientCaFile) and their scopes, by CN or subjectAltName. */
  clients: z.array(z.strictObject({ subject: z.string().min(1), scopes: scopeList })).default([]),
});

/** The `tls` section: TLS on the fylr's HTTP port. */
export const fylrTlsSchema = z.strictObject({
  certFile: z.string().min(1),
  keyFile: z.string().min(1),
  /** Ask clients for a certificate signed by this CA (see auth.clients). */
  clientCaFile: z.string().min(1).optional(),
});

/** Compiled `auth`; undefined on a fylr without any credential configured (loopback only). */
export interface ApiAuthConfig {
  /** The tokens of the config itself. */
  readonly tokens: readonly TokenEntry[];
  readonly tokensFile: string | undefined;
  /** 0: the tokens file is read only at start and on reload(). */
  readonly reloadIntervalMs: number;
  readonly clients: readonly ClientRule[];
}

/** Compiled `tls`. */
export type FylrTlsConfig = z.output<typeof fylrTlsSchema>;

/**
 * Checks `auth` against `tls` and `listen`; throws ConfigError naming the key. A fylr whose
 * `listen` is not a loopback address must have some credential configured.
 */
export function compileApiAuth(
  input: z.output<typeof apiAuthSchema>,
  tls: FylrTlsConfig | undefined,
  listen: string,
  source: string,
): ApiAuthConfig | undefined {
  if (input.clients.length > 0 && !tls?.clientCaFile) {
    throw new ConfigError(`${source}: auth.clients: needs tls.clientCaFile (the CA that signs the client certificates)`);
  }
  if (tls?.clientCaFile && input.clients.length === 0) {
    throw new ConfigError(`${source}: tls.clientCaFile: give auth.clients, which maps client certificates to scopes`);
  }
  try {
    new TokenSet(input.tokens);
  } catch (err) {
    throw new ConfigError(`${source}: auth.tokens: ${(err as Error).message}`);
  }
  const configured = input.tokens.length > 0 || input.tokensFile !== undefined || input.clients.length > 0;
  if (!configured) {
    const host = splitHostPort(listen)?.host ?? listen;
    if (!isLoopbackHost(host)) {
      throw new ConfigError(
        `${source}: auth: required when listen (${listen}) is not a loopback address: give auth.tokens, auth.tokensFile ` +
          "(or set SLOTBROKER_API_TOKENS_FILE) or auth.clients",
      );
    }
    return undefined;
  }
  return { tokens: input.tokens, tokensFile: input.tokensFile, reloadIntervalMs: input.reloadInterval, clients: input.clients };
}
