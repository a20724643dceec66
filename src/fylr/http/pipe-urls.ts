/** Path prefix of in-pipes (the job's stdin, read with GET). */
export const PIPE_IN_PREFIX = "/pipe/in/";
/** Path prefix of out-pipes (the job's stdout, written with PUT). */
export const PIPE_OUT_PREFIX = "/pipe/out/";

/** Pipe ids to put into URLs; either may be absent. */
export interface PipeIds {
  readonly in?: string;
  readonly out?: string;
}

/** The pipe URLs for `ids`, keyed like the ids. */
export interface PipeUrls {
  readonly in?: string;
  readonly out?: string;
}

/**
 * The URLs a job's execserver uses for its pipes on this fylr, e.g.
 * `http://10.0.0.5:7700/pipe/in/ID` (`https://` when the port serves TLS). `host` is the
 * fylr's address as the execserver reaches it (IPv6 literals are bracketed, zone ids
 * percent-encoded).
 */
export function pipeUrls(host: string, port: number, ids: PipeIds, scheme: "http" | "https" = "http"): PipeUrls {
  const base = `${scheme}://${urlHost(host)}:${port}`;
  return {
    ...(ids.in === undefined ? {} : { in: `${base}${PIPE_IN_PREFIX}${encodeURIComponent(ids.in)}` }),
    ...(ids.out === undefined ? {} : { out: `${base}${PIPE_OUT_PREFIX}${encodeURIComponent(ids.out)}` }),
  };
}

/** A host as it goes into a URL authority: "[::1]" for IPv6, unchanged otherwise. */
export function urlHost(host: string): string {
  if (host.startsWith("[") || !host.includes(":")) return host;
  return `[${host.replace(/%(?!25)/, "%25")}]`;
}
