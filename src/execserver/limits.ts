import type { JobSpec } from "../../gen/slotbroker/v1/broker_pb.js";
import type { ServiceConfig } from "./config.js";
import { durationMs } from "@bufbuild/protobuf/wkt";

/**
 * Size limits on what a peer may send. They bound the memory one frame can pin; a frame
 * over a limit is rejected with INVALID_ARGUMENT naming the field. The gRPC message size
 * limit (maxFrameBytes) caps a whole frame before it is even decoded.
 */
export const limits = {
  /** Want.job_id and friends, in UTF-8 bytes. */
  jobIdBytes: 128,
  /** Want.service, in UTF-8 bytes. */
  serviceBytes: 128,
  /** JobSpec.args: entries, and bytes summed over them. */
  args: 4096,
  argsBytes: 256 * 1024,
  /** JobSpec.env: entries, and bytes of names plus values. */
  env: 256,
  envBytes: 64 * 1024,
  /** JobSpec.stdin_url / stdout_url, in bytes. */
  urlBytes: 8192,
  /** JobSpec.labels: entries, and bytes of keys plus values. */
  labels: 64,
  labelsBytes: 16 * 1024,
  /** Largest ConnectRequest frame accepted by gRPC. */
  maxFrameBytes: 1024 * 1024,
  /** Frames queued to a peer that does not read before its stream is failed. */
  maxQueuedFrames: 10_000,
} as const;

/** UTF-8 byte length, skipping the count for strings too short to exceed `max`. */
export function exceedsBytes(text: string, max: number): boolean {
  // A UTF-16 code unit encodes to at most 3 UTF-8 bytes.
  return text.length * 3 > max && Buffer.byteLength(text) > max;
}

/** Why a job_id is unacceptable, or undefined when it is fine. */
export function checkJobId(jobId: string): string | undefined {
  if (jobId === "") return "job_id: must not be empty";
  if (exceedsBytes(jobId, limits.jobIdBytes)) return `job_id: longer than ${limits.jobIdBytes} bytes`;
  return undefined;
}

/** What a validated JobSpec resolves to for the runner. */
export interface CheckedJob {
  readonly args: readonly string[];
  readonly env: Readonly<Record<string, string>>;
  readonly timeoutMs: number;
  readonly stdinUrl: string | undefined;
  readonly stdoutUrl: string | undefined;
}

/** Validates a JobSpec against the limits and the service's env allow-list. */
export function checkJobSpec(spec: JobSpec | undefined, service: ServiceConfig): CheckedJob | { readonly error: string } {
  const args = spec?.args ?? [];
  if (args.length > limits.args) return { error: `spec.args: more than ${limits.args} entries` };
  let bytes = 0;
  for (const arg of args) bytes += Buffer.byteLength(arg);
  if (bytes > limits.argsBytes) return { error: `spec.args: more than ${limits.argsBytes} bytes` };

  const env = spec?.env ?? {};
  const names = Object.keys(env);
  if (names.length > limits.env) return { error: `spec.env: more than ${limits.env} entries` };
  bytes = 0;
  for (const envName of names) {
    if (!service.env.includes(envName)) {
      return { error: `spec.env: "${envName.slice(0, 64)}" is not allowed for service ${service.name}` };
    }
    bytes += Buffer.byteLength(envName) + Buffer.byteLength(env[envName]!);
  }
  if (bytes > limits.envBytes) return { error: `spec.env: more than ${limits.envBytes} bytes` };

  const labels = spec?.labels ?? {};
  const labelKeys = Object.keys(labels);
  if (labelKeys.length > limits.labels) return { error: `spec.labels: more than ${limits.labels} entries` };
  bytes = 0;
  for (const key of labelKeys) bytes += Buffer.byteLength(key) + Buffer.byteLength(labels[key]!);
  if (bytes > limits.labelsBytes) return { error: `spec.labels: more than ${limits.labelsBytes} bytes` };

  const stdinUrl = spec?.stdinUrl || undefined;
  const stdoutUrl = spec?.stdoutUrl || undefined;
  for (const [field, url] of [["spec.stdin_url", stdinUrl], ["spec.stdout_url", stdoutUrl]] as const) {
    if (url === undefined) continue;
    if (exceedsBytes(url, limits.urlBytes)) return { error: `${field}: longer than ${limits.urlBytes} bytes` };
    if (!/^https?:\/\//i.test(url) || !URL.canParse(url)) return { error: `${field}: expected an http(s) URL` };
  }

  const requested = spec?.timeout && durationMs(spec.timeout);
  if (requested !== undefined && requested <= 0) return { error: "spec.timeout: must be more than 0" };
  const timeoutMs = requested === undefined ? service.timeoutMs : Math.min(requested, service.timeoutMs);
  return { args, env, timeoutMs, stdinUrl, stdoutUrl };
}
