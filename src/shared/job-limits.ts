/**
 * Limits an execserver enforces on a job's spec, shared with the fylr so Submit refuses
 * what an execserver would refuse anyway: an item that can never run fails at submit,
 * naming the field, instead of at run time after a slot was taken.
 */
export const jobSpecLimits = {
  /** JobSpec.args: entries, and bytes summed over them. */
  args: 4096,
  argsBytes: 256 * 1024,
  /** JobSpec.env: entries, and bytes of names plus values. */
  env: 256,
  envBytes: 64 * 1024,
  /** JobSpec.stdin_inline, in bytes: larger stdin goes through a pipe (stdin_url). */
  stdinInlineBytes: 64 * 1024,
  /** Largest ConnectRequest frame an execserver accepts (gRPC's message size limit). */
  maxFrameBytes: 1024 * 1024,
} as const;

/** Limits an execserver enforces on a WANT's fairness key and weight. */
export const fairnessLimits = {
  /** Want.fairness_key, in UTF-8 bytes. */
  keyBytes: 128,
  /** Want.fairness_weight: grants per turn of a key. */
  weight: 1000,
} as const;

/** Why `args` breaks the execserver's limits, or undefined. `at` names the field. */
export function checkArgs(args: readonly string[], at: string): string | undefined {
  if (args.length > jobSpecLimits.args) return `${at}: more than ${jobSpecLimits.args} entries`;
  let bytes = 0;
  for (const arg of args) bytes += Buffer.byteLength(arg);
  if (bytes > jobSpecLimits.argsBytes) return `${at}: ${bytes} bytes, more than ${jobSpecLimits.argsBytes}`;
  return undefined;
}

/** Why `env` breaks the execserver's size limits, or undefined. `at` names the field. */
export function checkEnvSize(env: Readonly<Record<string, string>>, at: string): string | undefined {
  const names = Object.keys(env);
  if (names.length > jobSpecLimits.env) return `${at}: more than ${jobSpecLimits.env} entries`;
  let bytes = 0;
  for (const name of names) bytes += Buffer.byteLength(name) + Buffer.byteLength(env[name]!);
  if (bytes > jobSpecLimits.envBytes) return `${at}: ${bytes} bytes, more than ${jobSpecLimits.envBytes}`;
  return undefined;
}

/**
 * Why `args` or `env` values cannot reach a process (an execve() string ends at a NUL:
 * the argument would be cut short silently), or undefined. `at` names the spec, e.g.
 * "calls[0]" or "spec"; the fylr's Submit, the broker JOB and the legacy PUT /job refuse
 * with these same words.
 */
export function checkNoNul(args: readonly string[], env: Readonly<Record<string, string>>, at: string): string | undefined {
  for (let k = 0; k < args.length; k++) if (args[k]!.includes("\0")) return `${at}.args[${k}]: must not contain a NUL character`;
  for (const [name, value] of Object.entries(env)) if (value.includes("\0")) return `${at}.env.${name}: must not contain a NUL character`;
  return undefined;
}
