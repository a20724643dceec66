import * as http from "node:http";
import * as https from "node:https";
import { parseArgs } from "node:util";
import type { GetStatusResponse } from "../../gen/slotbroker/v1/broker_pb.js";
import { authorizationHeaders, tlsOptions } from "../api/client.js";
import { fetchExecserverStatus } from "../app/execserver-status.js";
import type { FylrStatusJson } from "../app/fylr-routes.js";
import { apiOptions, apiOptionsHelp, describeApiError, resolveApiConnection, type ApiConnection } from "./api-options.js";
import { Code, SlotbrokerError } from "../shared/errors.js";
import { execserverSection, queueSection } from "./status-tables.js";

const help = `usage: slotbroker status [--api URL] [--token-file FILE] [--execserver ADDR]... [--token TOKEN]

Prints, as text tables, each execserver's waitgroups (slots, running, offered, free,
waiting), its want-book depth by priority and its connections, then the queue by state and
the live fylrs.

options:
${apiOptionsHelp}
                     (the fylr is asked for the queue and the execserver addresses; its
                     token needs the read scope)
  --execserver ADDR  ask this execserver (host:port) instead of the fylr's addresses (repeat)
  --token TOKEN      bearer token for the execservers (default SLOTBROKER_TOKEN)
  -h, --help         this text

Exit code 1 when nothing could be reached.`;

/** `slotbroker status`: resolves with the exit code. */
export async function run(argv: string[]): Promise<number> {
  let values;
  try {
    ({ values } = parseArgs({
      args: argv,
      options: {
        ...apiOptions,
        execserver: { type: "string", multiple: true },
        token: { type: "string" },
        help: { type: "boolean", short: "h" },
      },
      strict: true,
    }));
  } catch (err) {
    process.stderr.write(`slotbroker status: ${(err as Error).message}\n\n${help}\n`);
    return 2;
  }
  if (values.help) {
    process.stdout.write(`${help}\n`);
    return 0;
  }
  let target: ApiConnection;
  try {
    target = resolveApiConnection(values);
  } catch (err) {
    process.stderr.write(`slotbroker status: ${(err as Error).message}\n`);
    return 2;
  }
  const api = target.url;
  const token = values.token ?? process.env.SLOTBROKER_TOKEN;
  let reached = 0;
  const fylr = await fetchFylrStatus(target).catch((err: unknown) => {
    process.stderr.write(`slotbroker status: fylr at ${api} (from ${target.source}): ${describeApiError(err, target)}\n`);
    return undefined;
  });
  const addresses = values.execserver ?? fylr?.execservers.addresses ?? [];
  if (addresses.length === 0) process.stderr.write("slotbroker status: no execserver to ask (give --execserver ADDR)\n");
  const sections: string[] = [];
  for (const address of addresses) {
    let status: GetStatusResponse;
    try {
      status = await fetchExecserverStatus(address, { token });
    } catch (err) {
      sections.push(`EXECSERVER at ${address}: unreachable (${SlotbrokerError.from(err).message})`);
      continue;
    }
    reached++;
    sections.push(execserverSection(address, status));
  }
  if (fylr) {
    reached++;
    sections.push(queueSection(fylr, api));
  }
  process.stdout.write(`${sections.join("\n\n")}\n`);
  return reached > 0 ? 0 : 1;
}

// node:http(s) rather than fetch: an https fylr may need its own CA and a client certificate.
function fetchFylrStatus(target: ApiConnection): Promise<FylrStatusJson> {
  const url = new URL("/status.json", target.url);
  const options = { headers: authorizationHeaders(target.credentials), signal: AbortSignal.timeout(5000) };
  return new Promise((resolve, reject) => {
    const onResponse = (res: http.IncomingMessage): void => {
      let body = "";
      res.setEncoding("utf8").on("data", (chunk: string) => (body += chunk));
      res.on("error", reject);
      res.on("end", () => {
        if (res.statusCode !== 200) {
          const code = res.statusCode === 401 ? Code.Unauthenticated : res.statusCode === 403 ? Code.PermissionDenied : Code.Unavailable;
          return reject(new SlotbrokerError(code, code === Code.Unavailable ? `GET /status.json answered ${res.statusCode}: ${body.trim()}` : body.trim()));
        }
        try {
          resolve(JSON.parse(body) as FylrStatusJson);
        } catch (err) {
          reject(err instanceof Error ? err : new Error(String(err)));
        }
      });
    };
    const req = url.protocol === "https:" ? https.get(url, { ...options, ...tlsOptions(target.credentials) }, onResponse) : http.get(url, options, onResponse);
    req.on("error", reject);
  });
}
