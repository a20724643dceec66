/**
 * The argv of `slotbroker submit`, pure: calls are built in the order their flags appear,
 * so `--arg`, `--env` and `--timeout` belong to the call they follow.
 *
 *   --service sha256sum --stdin FILE                     one call
 *   --service cat --stdin FILE --then gzip --then base64 a chain; each --then reads the
 *                                                        previous call's stdout
 *   --local checksum --param algorithm=sha1 --stdin FILE a local action
 */
import { create } from "@bufbuild/protobuf";
import { ExecCallSchema, LocalActionSchema, SubmitRequestSchema, type ExecCall, type SubmitRequest } from "../../gen/slotbroker/v1/queue_pb.js";
import { parseArgs } from "node:util";
import { parseDuration } from "../shared/duration.js";
import { durationFromMs, timestampFromDate } from "@bufbuild/protobuf/wkt";
import { apiOptions, type ApiFlags } from "./api-options.js";

/** What the command line asks for. */
export interface SubmitPlan {
  /** The request, without the bytes of `--stdin` (see `withStdin`). */
  readonly request: SubmitRequest;
  /** `--stdin FILE` ("-" is standard input), for the first call or the local action. */
  readonly stdinPath: string | undefined;
  readonly api: string | undefined;
  /** --api and the credential flags (--token-file, --ca, --cert, --key). */
  readonly apiFlags: ApiFlags;
  readonly wait: boolean;
  readonly json: boolean;
  readonly help: boolean;
}

const options = {
  service: { type: "string" },
  then: { type: "string" },
  arg: { type: "string" },
  env: { type: "string" },
  timeout: { type: "string" },
  stdin: { type: "string" },
  "stdin-url": { type: "string" },
  local: { type: "string" },
  param: { type: "string" },
  priority: { type: "string" },
  "idempotency-key": { type: "string" },
  "start-after": { type: "string" },
  "max-attempts": { type: "string" },
  "fairness-key": { type: "string" },
  weight: { type: "string" },
  "key-limit": { type: "string" },
  ...apiOptions,
  wait: { type: "boolean", short: "w" },
  json: { type: "boolean" },
  help: { type: "boolean", short: "h" },
} as const;

const repeatable = new Set(["then", "arg", "env", "param"]);

/** Parses submit's argv; throws an Error naming the flag that is wrong. */
export function parseSubmitArgs(argv: readonly string[], now: Date = new Date()): SubmitPlan {
  const { tokens } = parseArgs({ args: [...argv], options, strict: true, tokens: true, allowPositionals: false });
  const calls: ExecCall[] = [];
  let local: { name: string; params: Record<string, string> } | undefined;
  const seen = new Set<string>();
  const once: Record<string, string | boolean> = {};
  let stdinPath: string | undefined;
  let stdinUrl: string | undefined;
  for (const token of tokens) {
    if (token.kind !== "option") continue;
    const name = token.name;
    const value = token.value ?? true;
    if (!repeatable.has(name) && seen.has(name)) throw new Error(`--${name}: given twice${name === "service" ? "; chain another call with --then SERVICE" : ""}`);
    seen.add(name);
    const current = calls[calls.length - 1];
    const text = String(value);
    switch (name) {
      case "service":
        if (local) throw new Error("--service: give either --service or --local, not both");
        calls.push(create(ExecCallSchema, { service: text }));
        break;
      case "then":
        if (!current) throw new Error("--then: give the first call with --service before chaining");
        calls.push(create(ExecCallSchema, { service: text, stdin: { case: "stdinFromPrevious", value: true } }));
        break;
      case "local":
        if (calls.length > 0) throw new Error("--local: give either --service or --local, not both");
        local = { name: text, params: {} };
        break;
      case "arg":
        if (!current) throw new Error(`--arg ${text}: give --service first; --arg adds to the call it follows`);
        current.args.push(text);
        break;
      case "env": {
        if (!current) throw new Error(`--env ${text}: give --service first; --env sets it for the call it follows`);
        const [key, val] = keyValue("--env", text);
        current.env[key] = val;
        break;
      }
      case "timeout": {
        if (!current) throw new Error(`--timeout: give --service first; it sets the timeout of the call it follows`);
        current.timeout = durationFromMs(duration("--timeout", text));
        break;
      }
      case "param": {
        if (!local) throw new Error(`--param ${text}: only for a --local action`);
        const [key, val] = keyValue("--param", text);
        local.params[key] = val;
        break;
      }
      case "stdin":
      case "stdin-url":
        if (calls.length > 1) throw new Error(`--${name}: only the first call reads it (a --then call reads the previous call's stdout); put it before --then`);
        if (stdinPath !== undefined || stdinUrl !== undefined) throw new Error(`--${name}: give either --stdin or --stdin-url`);
        if (name === "stdin") stdinPath = text;
        else stdinUrl = text;
        break;
      default:
        once[name] = value;
    }
  }
  if (once.help) return { request: create(SubmitRequestSchema), stdinPath: undefined, api: undefined, apiFlags: {}, wait: false, json: false, help: true };
  if (calls.length === 0 && !local) throw new Error("give --service SERVICE (or --local ACTION)");
  if (stdinUrl !== undefined) {
    if (local) throw new Error("--stdin-url: a local action takes its input from --stdin FILE");
    calls[0]!.stdin = { case: "stdinUrl", value: stdinUrl };
  }
  const request = create(SubmitRequestSchema, {
    calls,
    local: local && create(LocalActionSchema, { name: local.name, params: local.params }),
    priority: integer("--priority", once.priority, -2_147_483_648, 2_147_483_647) ?? 0,
    idempotencyKey: typeof once["idempotency-key"] === "string" ? once["idempotency-key"] : "",
    maxAttempts: integer("--max-attempts", once["max-attempts"], 1, 1000) ?? 0,
    fairnessKey: typeof once["fairness-key"] === "string" ? once["fairness-key"] : "",
    fairnessWeight: integer("--weight", once.weight, 1, 1000) ?? 0,
    fairnessLimit: integer("--key-limit", once["key-limit"], 1, 1_000_000) ?? 0,
    startAfter: typeof once["start-after"] === "string" ? timestampFromDate(startAfter(once["start-after"], now)) : undefined,
  });
  return {
    request,
    stdinPath,
    api: typeof once.api === "string" ? once.api : undefined,
    apiFlags: Object.fromEntries(Object.keys(apiOptions).flatMap((flag) => (typeof once[flag] === "string" ? [[flag, once[flag]]] : []))),
    wait: once.wait === true,
    json: once.json === true,
    help: false,
  };
}

/** The request with `bytes` as the first call's stdin (or the local action's input). */
export function withStdin(request: SubmitRequest, bytes: Uint8Array | undefined): SubmitRequest {
  if (!bytes) return request;
  if (request.local) request.local.input = bytes;
  else if (request.calls[0]) request.calls[0].stdin = { case: "stdinData", value: bytes };
  return request;
}

function keyValue(flag: string, text: string): [string, string] {
  const at = text.indexOf("=");
  if (at <= 0) throw new Error(`${flag} ${text}: expected NAME=VALUE`);
  return [text.slice(0, at), text.slice(at + 1)];
}

function duration(flag: string, text: string): number {
  const ms = parseDuration(text);
  if (ms === undefined || ms <= 0) throw new Error(`${flag} ${text}: expected a duration with a unit, e.g. 30s or 5m`);
  return ms;
}

function integer(flag: string, value: string | boolean | undefined, min: number, max: number): number | undefined {
  if (value === undefined) return undefined;
  const text = String(value);
  const n = Number(text);
  if (!/^-?\d+$/.test(text) || n < min || n > max) throw new Error(`${flag} ${text}: expected an integer ${min}…${max}`);
  return n;
}

// "90s" (from now) or an ISO time.
function startAfter(text: string, now: Date): Date {
  const ms = parseDuration(text);
  if (ms !== undefined) return new Date(now.getTime() + ms);
  const at = new Date(text);
  if (Number.isNaN(at.getTime())) throw new Error(`--start-after ${text}: expected a duration from now (e.g. 5m) or an ISO time`);
  return at;
}
