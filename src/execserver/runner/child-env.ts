/** PATH used when neither the job nor the execserver's own environment has one. */
export const FALLBACK_PATH = "/usr/local/bin:/usr/bin:/bin";

/**
 * The complete environment of a job's process: exactly the job's (already allow-listed)
 * variables plus PATH, so `command[0]` can be a bare name like `cat`. PATH is the job's
 * own when the service allows it, otherwise the execserver's PATH (`hostPath`), otherwise
 * FALLBACK_PATH. Nothing else of the execserver's environment (tokens, HOME, …) leaks.
 */
export function childEnv(given: Readonly<Record<string, string>>, hostPath: string | undefined): Record<string, string> {
  const env: Record<string, string> = { ...given };
  if (env.PATH === undefined) env.PATH = hostPath || FALLBACK_PATH;
  return env;
}
