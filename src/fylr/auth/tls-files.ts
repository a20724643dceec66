import { readFileSync } from "node:fs";
import { ConfigError } from "../../shared/errors.js";
import type { ServerTls } from "../http/server.js";
import type { FylrTlsConfig } from "./config.js";

/** Reads the PEM files of `tls`; a file that cannot be read is a ConfigError naming its key. */
export function readServerTls(tls: FylrTlsConfig): ServerTls {
  const read = (key: string, path: string): Buffer => {
    try {
      return readFileSync(path);
    } catch (err) {
      throw new ConfigError(`tls.${key}: cannot read ${path}: ${(err as Error).message}`, { cause: err });
    }
  };
  return {
    cert: read("certFile", tls.certFile),
    key: read("keyFile", tls.keyFile),
    ...(tls.clientCaFile !== undefined && { ca: read("clientCaFile", tls.clientCaFile) }),
  };
}
