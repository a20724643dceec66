// The OTLP receiver of the trace tests and the traced benchmark: a minimal OpenTelemetry
// Collector built with Go by scripts/build-otlp-receiver.sh, and the spans it received, read
// from its OTLP JSON lines.
import { execFile, spawn, type ChildProcess } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { promisify } from "node:util";
import { freePort } from "../src/shared/free-port.js";
import { waitForOutput } from "./child-output.js";
import { projectRoot } from "./node-children.js";

const execFileP = promisify(execFile);

/** One span as the collector received it, attributes flattened. */
export interface ReceivedSpan {
  readonly service: string;
  readonly traceId: string;
  readonly spanId: string;
  readonly parentSpanId: string;
  readonly name: string;
  readonly kind: number;
  readonly attributes: Readonly<Record<string, string | number | boolean>>;
  readonly status: { readonly code?: number; readonly message?: string };
}

/** A running receiver. */
export interface OtlpReceiver {
  /** "http://127.0.0.1:PORT": OTEL_EXPORTER_OTLP_ENDPOINT for the processes under test. */
  readonly endpoint: string;
  readonly child: ChildProcess;
  /** Every span received so far. */
  spans(): ReceivedSpan[];
  /** Stops it (SIGTERM) and removes its files. */
  stop(): Promise<void>;
}

/** Builds (first time) and starts the receiver on a free loopback port. */
export async function startOtlpReceiver(): Promise<OtlpReceiver> {
  let bin: string;
  try {
    bin = (await execFileP(join(projectRoot, "scripts/build-otlp-receiver.sh"), { timeout: 600_000, maxBuffer: 16 * 1024 * 1024 })).stdout.trim();
  } catch (err) {
    const e = err as { stderr?: string; message: string };
    throw new Error(`scripts/build-otlp-receiver.sh failed (Go is required for the trace tests): ${e.stderr ?? e.message}`);
  }
  const dir = mkdtempSync(join(tmpdir(), "slotbroker-otlp-"));
  const out = join(dir, "spans.jsonl");
  const address = `127.0.0.1:${await freePort()}`;
  const child = spawn(bin, ["-http", address, "-out", out], { stdio: ["ignore", "pipe", "pipe"] });
  let log = "";
  child.stderr.setEncoding("utf8").on("data", (chunk: string) => (log = (log + chunk).slice(-20_000)));
  const stop = async (): Promise<void> => {
    if (child.exitCode === null && child.signalCode === null) {
      const exited = new Promise((done) => child.once("exit", done));
      child.kill("SIGTERM");
      await exited;
    }
    rmSync(dir, { recursive: true, force: true });
  };
  const receiver: OtlpReceiver = { endpoint: `http://${address}`, child, spans: () => readSpans(out), stop };
  try {
    await waitForOutput(child, /^listening http=/m, { timeoutMs: 30_000, context: () => log });
  } catch (err) {
    await stop();
    throw err;
  }
  return receiver;
}

interface OtlpValue {
  stringValue?: string;
  intValue?: string | number;
  doubleValue?: number;
  boolValue?: boolean;
}
interface OtlpAttribute {
  key: string;
  value: OtlpValue;
}
interface OtlpLine {
  resourceSpans?: {
    resource?: { attributes?: OtlpAttribute[] };
    scopeSpans?: { spans?: { traceId: string; spanId: string; parentSpanId?: string; name: string; kind?: number; attributes?: OtlpAttribute[]; status?: { code?: number; message?: string } }[] }[];
  }[];
}

function flatten(attributes: OtlpAttribute[] | undefined): Record<string, string | number | boolean> {
  const out: Record<string, string | number | boolean> = {};
  for (const { key, value } of attributes ?? []) {
    out[key] = value.stringValue ?? (value.intValue !== undefined ? Number(value.intValue) : (value.doubleValue ?? value.boolValue ?? ""));
  }
  return out;
}

function readSpans(file: string): ReceivedSpan[] {
  let text = "";
  try {
    text = readFileSync(file, "utf8");
  } catch {
    return [];
  }
  const spans: ReceivedSpan[] = [];
  for (const line of text.split("\n")) {
    if (!line.trim()) continue;
    for (const rs of (JSON.parse(line) as OtlpLine).resourceSpans ?? []) {
      const service = String(flatten(rs.resource?.attributes)["service.name"] ?? "");
      for (const ss of rs.scopeSpans ?? []) {
        for (const s of ss.spans ?? []) {
          spans.push({
            service,
            traceId: s.traceId,
            spanId: s.spanId,
            parentSpanId: s.parentSpanId ?? "",
            name: s.name,
            kind: s.kind ?? 0,
            attributes: flatten(s.attributes),
            status: s.status ?? {},
          });
        }
      }
    }
  }
  return spans;
}
