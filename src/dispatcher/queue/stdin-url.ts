// stdin_url against dispatcher.stdinUrlPrefixes. Prefixes are compared to the URL as the
// WHATWG parser serialises it (which already resolves "..", "%2e%2e" and "\" in http
// paths). What it leaves encoded — a "/" or "\" inside a percent-escape ("..%2f"), a
// double-encoded escape ("%252e"), a malformed one — many file servers decode and then
// resolve, so a URL that merely starts with a prefix could still reach outside it: such a
// path cannot be checked and is refused; so is a dot segment disguised by a ";" parameter.

/** A prefix as URLs are compared: lower-case scheme and host, no default port; or the reason it is unusable. */
export function normalizeUrlPrefix(prefix: string): { prefix: string } | { error: string } {
  let url: URL;
  try {
    url = new URL(prefix);
  } catch {
    return { error: "not a URL" };
  }
  if (url.protocol !== "http:" && url.protocol !== "https:") return { error: "expected an http(s) URL prefix" };
  if (url.username || url.password || url.search || url.hash) return { error: "a prefix has no user, query or fragment" };
  const refused = pathRefusal(url.pathname);
  if (refused) return { error: refused };
  return { prefix: url.href };
}

/** Why `url` (already parsed) is not under one of `prefixes`; undefined when it is, or when there are none. */
export function stdinUrlRefusal(url: URL, prefixes: readonly string[]): string | undefined {
  if (prefixes.length === 0) return undefined;
  const refused = pathRefusal(url.pathname);
  if (refused) return `${refused}, so it cannot be checked against dispatcher.stdinUrlPrefixes`;
  if (url.username || url.password) return "a user or password in the URL is not allowed with dispatcher.stdinUrlPrefixes";
  if (!prefixes.some((prefix) => url.href.startsWith(prefix))) return "not under an allowed prefix (dispatcher.stdinUrlPrefixes)";
  return undefined;
}

function pathRefusal(pathname: string): string | undefined {
  for (const segment of pathname.split("/")) {
    let decoded = segment;
    if (segment.includes("%")) {
      try {
        decoded = decodeURIComponent(segment);
      } catch {
        return "its path has a malformed percent-escape";
      }
      if (decoded.includes("/") || decoded.includes("\\")) return "its path hides a '/' or '\\' in a percent-escape (%2F, %5C)";
      if (decoded.includes("%")) return "its path is percent-encoded twice (%25)";
      if (decoded.includes("\0")) return "its path has an encoded NUL (%00)";
    }
    // The parser removed every plain "." and ".." segment: one left is disguised, by
    // escapes or by a ";" parameter (which servlet containers strip before resolving).
    const name = decoded.split(";", 1)[0];
    if (name === "." || name === "..") return "its path has a dot segment hidden by percent-escapes or a ';' parameter";
  }
  return undefined;
}
