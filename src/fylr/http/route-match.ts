/**
 * Matches a URL path against a route pattern of literal segments and ":name"
 * placeholders. Returns the decoded placeholder values, or undefined when the path
 * does not fit (different segment count, a literal differs, a placeholder is empty or
 * badly percent-encoded). The query string is ignored.
 */
export function matchPath(pattern: string, url: string): Record<string, string> | undefined {
  const query = url.indexOf("?");
  const pathname = query < 0 ? url : url.slice(0, query);
  // Every request is tried against every raw route before Connect gets it: the pattern's
  // literal head settles most misses without splitting anything.
  const head = literalHead(pattern);
  if (head === pattern) return pathname === pattern ? {} : undefined;
  if (!pathname.startsWith(head)) return undefined;
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

const heads = new Map<string, string>();

// The pattern up to its first placeholder (all of it when it has none).
function literalHead(pattern: string): string {
  let head = heads.get(pattern);
  if (head === undefined) {
    const at = pattern.indexOf(":");
    head = at < 0 ? pattern : pattern.slice(0, at);
    heads.set(pattern, head);
  }
  return head;
}
