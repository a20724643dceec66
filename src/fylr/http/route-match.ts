/**
 * Matches a URL path against a route pattern of literal segments and ":name"
 * placeholders. Returns the decoded placeholder values, or undefined when the path
 * does not fit (different segment count, a literal differs, a placeholder is empty or
 * badly percent-encoded). The query string is ignored.
 */
export function matchPath(pattern: string, url: string): Record<string, string> | undefined {
  const pathname = url.split("?", 1)[0] ?? "";
  const want = pattern.split("/");
  const got = pathname.split("/");
  if (want.length !== got.length) return undefined;
  const params: Record<string, string> = {};
  for (let i = 0; i < want.length; i++) {
    const w = want[i]!;
    const g = got[i]!;
    if (!w.startsWith(":")) {
      if (w !== g) return undefined;
      continue;
    }
    if (g === "") return undefined;
    try {
      params[w.slice(1)] = decodeURIComponent(g);
    } catch {
      return undefined;
    }
  }
  return params;
}
