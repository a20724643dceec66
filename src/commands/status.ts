import { parseArgs } from "node:util";
import type { GetStatusResponse } from "../../gen/slotbroker/v1/broker_pb.js";
import { fetchExecserverStatus, resolveApi, type FylrStatusJson } from "../app/index.js";
import { SlotbrokerError } from "../shared/errors.js";
import { execserverSection, queueSection } from "./status-tables.js";

const help = `usage: slotbroker status [--api URL] [--execserver ADDR]... [--token TOKEN]

Prints, as text tables, each execserver's waitgroups (slots, running, offered, free,
waiting), its want-book depth by priority and its connections, then the queue by state and
the live fylrs.

options:
  --api URL           the fylr to ask for the queue and the execserver addresses
                      (default SLOTBROKER_API, else the running "slotbroker up",
                      else http://127.0.0.1:7700)
  --execserver ADDR   ask this execserver (host:port) instead of the fylr's addresses (repeat)
  --token TOKEN       bearer token for the execservers (default SLOTBROKER_TOKEN)
  -h, --help          this text

Exit code 1 when nothing could be reached.`;

/** `slotbroker status`: resolves with the exit code. */
export async function run(argv: string[]): Promise<number> {
  let values;
  try {
    ({ values } = parseArgs({
      args: argv,
      options: {
        api: { type: "string" },
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
  const target = resolveApi(values.api);
  const api = target.url;
  const token = values.token ?? process.env.SLOTBROKER_TOKEN;
  let reached = 0;
  const fylr = await fetchFylrStatus(api).catch((err: unknown) => {
    process.stderr.write(`slotbroker status: fylr at ${api} (from ${target.source}): ${SlotbrokerError.from(err).message}\n`);
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

async function fetchFylrStatus(api: string): Promise<FylrStatusJson> {
  const response = await fetch(`${api}/status.json`, { signal: AbortSignal.timeout(5000) });
  if (!response.ok) throw new SlotbrokerError(14, `GET /status.json answered ${response.status}: ${(await response.text()).trim()}`);
  return (await response.json()) as FylrStatusJson;
}
