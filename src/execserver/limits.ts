import type { JobSpec } from "../../gen/slotbroker/v1/broker_pb.js";
import type { ServiceConfig } from "./config.js";
import { durationMs } from "@bufbuild/protobuf/wkt";
import { checkArgs, checkEnvSize, checkNoNul, fairnessLimits, jobSpecLimits } from "../shared/job-limits.js";

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
  /** Want.fairness_key, in UTF-8 bytes (shared with the fylr). */
  fairnessKeyBytes: fairnessLimits.keyBytes,
  /** Want.fairness_weight: grants per turn of a key (shared with the fylr). */
  fairnessWeight: fairnessLimits.weight,
  /** JobSpec.args and env: entries and bytes (shared with the fylr's submit checks). */
  args: jobSpecLimits.args,
  argsBytes: jobSpecLimits.argsBytes,
  env: jobSpecLimits.env,
  envBytes: jobSpecLimits.envBytes,
  /** JobSpec.stdin_url / stdout_url, in bytes. */
  urlBytes: 8192,
  /** JobSpec.stdin_inline, in bytes. */
  stdinInlineBytes: jobSpecLimits.stdinInlineBytes,
  /** JobSpec.labels: entries, and bytes of keys plus values. */
  labels: 64,
  labelsBytes: 16 * 1024,
  /** Largest ConnectRequest frame accepted by gRPC. */
  maxFrameBytes: jobSpecLimits.maxFrameBytes,
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

/** Why a Want's fairness key or weight is unacceptable, or undefined when they are fine. */
export function checkFairness(key: string, weight: number): string | undefined {
  if (exceedsBytes(key, limits.fairnessKeyBytes)) return `fairness_key: longer than ${limits.fairnessKeyBytes} bytes`;
  if (weight > limits.fairnessWeight) return `fairness_weight: ${weight} is more than ${limits.fairnessWeight}`;
  return undefined;
}

/** What a validated JobSpec resolves to for the runner. */
export interface CheckedJob {
  readonly args: readonly string[];
  readonly env: Readonly<Record<string, string>>;
  readonly timeoutMs: number;
  readonly stdinUrl: string | undefined;
  /** The whole stdin, carried in the JOB frame; undefined when empty or unset. */
  readonly stdinInline: Uint8Array | undefined;
  readonly stdoutUrl: string | undefined;
}

/** Validates a JobSpec against the limits and the service's env allow-list. */
export function checkJobSpec(spec: JobSpec | undefined, service: ServiceConfig): CheckedJob | { readonly error: string } {
  const args = spec?.args ?? [];
  const badArgs = checkArgs(args, "spec.args");
  if (badArgs) return { error: badArgs };

  const env = spec?.env ?? {};
  const badEnv = checkEnvSize(env, "spec.env");
  if (badEnv) return { error: badEnv };
  for (const envName of Object.keys(env)) {
    if (!service.env.includes(envName)) {
      return { error: `spec.env: "${envName.slice(0, 64)}" is not allowed for service ${service.name}` };
    }
  }
  const nul = checkNoNul(args, env, "spec");
  if (nul) return { error: nul };
  let bytes = 0;

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

  const stdinInline = spec?.stdinInline?.byteLength ? spec.stdinInline : undefined;
  if (stdinInline !== undefined) {
    if (stdinInline.byteLength > limits.stdinInlineBytes) {
      return { error: `spec.stdin_inline: ${stdinInline.byteLength} bytes, more than ${limits.stdinInlineBytes}; send larger stdin through spec.stdin_url` };
    }
    if (stdinUrl !== undefined) return { error: "spec.stdin_inline: set together with spec.stdin_url; set at most one of them" };
  }

  const requested = spec?.timeout && durationMs(spec.timeout);
  if (requested !== undefined && requested <= 0) return { error: "spec.timeout: must be more than 0" };
  const timeoutMs = requested === undefined ? service.timeoutMs : Math.min(requested, service.timeoutMs);
  return { args, env, timeoutMs, stdinUrl, stdinInline, stdoutUrl };
}
