/**
 * How every command that talks to a fylr finds it and proves who it is: `--api URL`,
 * the API token (SLOTBROKER_API_TOKEN, or `--token-file FILE`) and, for an https fylr,
 * the CA to trust and a client certificate. Errors name the flag or variable.
 */
import { readFileSync } from "node:fs";
import { Code } from "@connectrpc/connect";
import type { ApiCredentials } from "../api/client.js";
import { resolveApi } from "../app/up-state.js";
import { toConnectError } from "../shared/errors.js";

/** parseArgs options of the connection flags. */
export const apiOptions = {
  api: { type: "string" },
  "token-file": { type: "string" },
  ca: { type: "string" },
  cert: { type: "string" },
  key: { type: "string" },
} as const;

/** The connection flags' lines for a command's help. */
export const apiOptionsHelp = `  --api URL          the fylr (default SLOTBROKER_API, else the running "slotbroker up",
                     else http://127.0.0.1:7700)
  --token-file FILE  read the fylr's API token from FILE (default: SLOTBROKER_API_TOKEN)
  --ca FILE          CA certificates to trust for an https fylr (default SLOTBROKER_API_CA,
                     else the system's)
  --cert FILE        client certificate for a fylr that asks for one (SLOTBROKER_API_CERT),
  --key FILE         and its key (SLOTBROKER_API_KEY)`;

/** The connection flags as parsed. */
export interface ApiFlags {
  readonly api?: string;
  readonly "token-file"?: string;
  readonly ca?: string;
  readonly cert?: string;
  readonly key?: string;
}

/** Where a command's fylr is and how to talk to it. */
export interface ApiConnection {
  readonly url: string;
  /** Where the URL came from ("--api", "SLOTBROKER_API", …). */
  readonly source: string;
  readonly credentials: ApiCredentials;
  /** Where the token came from, for error hints; undefined: none was given. */
  readonly tokenSource: string | undefined;
}

/** Resolves the flags and environment; throws an Error naming the flag or variable at fault. */
export function resolveApiConnection(flags: ApiFlags, env: NodeJS.ProcessEnv = process.env): ApiConnection {
  const { url, source } = resolveApi(flags.api, env);
  const file = (flag: string, variable: string, path: string | undefined): Buffer | undefined => {
    const chosen = path ?? env[variable];
    if (!chosen) return undefined;
    try {
      return readFileSync(chosen);
    } catch (err) {
      throw new Error(`${path === undefined ? variable : `--${flag}`}: cannot read ${chosen}: ${(err as Error).message}`);
    }
  };
  let token: string | undefined;
  let tokenSource: string | undefined;
  if (flags["token-file"] !== undefined) {
    token = file("token-file", "", flags["token-file"])!.toString("utf8").trim();
    tokenSource = `--token-file ${flags["token-file"]}`;
    if (!token) throw new Error(`--token-file: ${flags["token-file"]} is empty`);
  } else if (env.SLOTBROKER_API_TOKEN) {
    token = env.SLOTBROKER_API_TOKEN.trim();
    tokenSource = "SLOTBROKER_API_TOKEN";
  }
  const cert = file("cert", "SLOTBROKER_API_CERT", flags.cert);
  const key = file("key", "SLOTBROKER_API_KEY", flags.key);
  if (!cert !== !key) throw new Error(cert ? "--cert: give its key too (--key FILE or SLOTBROKER_API_KEY)" : "--key: give the certificate too (--cert FILE or SLOTBROKER_API_CERT)");
  const ca = file("ca", "SLOTBROKER_API_CA", flags.ca);
  const credentials: ApiCredentials = { ...(token !== undefined && { token }), ...(ca && { ca }), ...(cert && { cert }), ...(key && { key }) };
  return { url, source, credentials, tokenSource };
}

/**
 * One line for a failed call: the fylr's own message, and for a refusal what to do about
 * it ("401 unauthenticated: no credential …; no token was given: set SLOTBROKER_API_TOKEN …").
 */
export function describeApiError(err: unknown, connection: ApiConnection): string {
  const e = toConnectError(err);
  if (e.code === Code.Unauthenticated) {
    const hint = connection.tokenSource
      ? `the token from ${connection.tokenSource} was refused`
      : "no token was given: set SLOTBROKER_API_TOKEN or use --token-file FILE";
    return `${connection.url} answered 401 unauthenticated: ${e.rawMessage}; ${hint}`;
  }
  if (e.code === Code.PermissionDenied) return `${connection.url} answered 403 permission denied: ${e.rawMessage}`;
  return e.rawMessage;
}
