/**
 * The fylr's readiness (GET /readyz): can it do its work right now? Three checks — the
 * dispatcher runs (not stopping), an execserver is connected, the database takes its
 * writes — each with a reason. /livez (the process answers) and /healthz (serving, not
 * stopping) stay as they are: a readiness failure takes a replica out of a load balancer's
 * rotation, it must never get the process killed.
 */
import type { Dispatcher } from "../dispatcher/index.js";
import { writeHead, type BrokerClient, type RawRoute } from "../fylr/index.js";

/** One check's verdict. */
export interface CheckResult {
  readonly ok: boolean;
  readonly detail: string;
}

/** A named readiness check. */
export interface ReadinessCheck {
  readonly name: string;
  check(): CheckResult;
}

/** The answer of /readyz: 200 when every check that was not excluded passed. */
export interface ReadinessReport {
  readonly status: 200 | 400 | 503;
  readonly body: string;
}

/**
 * Runs the checks not named in `exclude` (as kube-apiserver's `/readyz?exclude=etcd`).
 * The body's first line says ready or which checks failed; one line per check follows,
 * `[+]name ok: …` or `[-]name failed: …`. An unknown name in `exclude` answers 400.
 */
export function readinessReport(checks: readonly ReadinessCheck[], exclude: readonly string[] = []): ReadinessReport {
  const names = checks.map((c) => c.name);
  const unknown = exclude.filter((name) => !names.includes(name));
  if (unknown.length > 0) return { status: 400, body: `unknown check(s) in exclude: ${unknown.join(", ")}; the checks are ${names.join(", ")}\n` };
  const lines: string[] = [];
  const failed: string[] = [];
  for (const c of checks) {
    if (exclude.includes(c.name)) {
      lines.push(`[+]${c.name} excluded: ok`);
      continue;
    }
    const { ok, detail } = c.check();
    if (!ok) failed.push(c.name);
    lines.push(`[${ok ? "+" : "-"}]${c.name} ${ok ? "ok" : "failed"}: ${detail.replace(/[\r\n]+/g, " ")}`);
  }
  const head = failed.length === 0 ? "ready" : `not ready: ${failed.join(", ")}`;
  return { status: failed.length === 0 ? 200 : 503, body: `${head}\n${lines.join("\n")}\n` };
}

/** The fylr's checks: "dispatcher", "execservers", "database". */
export function fylrReadinessChecks(dispatcher: Dispatcher, broker: BrokerClient): ReadinessCheck[] {
  return [
    { name: "dispatcher", check: () => ({ ok: dispatcher.state === "running", detail: dispatcher.state }) },
    { name: "execservers", check: () => execserversCheck(broker) },
    { name: "database", check: () => dispatcher.databaseWritable() },
  ];
}

// At least one instance that is not draining; otherwise why each address is not reached
// (the last error of its connections: a refused certificate, a wrong token, no route).
function execserversCheck(broker: BrokerClient): CheckResult {
  const instances = broker.instances();
  const serving = instances.filter((i) => !i.draining).length;
  if (serving > 0) return { ok: true, detail: `${serving} execserver instance(s) connected` };
  if (instances.length > 0) return { ok: false, detail: `every connected execserver instance (${instances.length}) is draining` };
  const reasons = broker.pools().map((pool) => {
    const errors = [...new Set(pool.connections().flatMap((c) => (c.lastError ? [c.lastError.message] : [])))];
    if (pool.tlsProblem) errors.unshift(pool.tlsProblem);
    return `${pool.address}: ${errors.length > 0 ? errors.join("; ") : "connecting"}`;
  });
  return { ok: false, detail: `no execserver connected (${reasons.join(" | ")})` };
}

/** GET /readyz over `checks`; `?exclude=NAME` (repeatable) leaves a check out. */
export function readinessRoute(checks: readonly ReadinessCheck[]): RawRoute {
  return {
    path: "/readyz",
    methods: ["GET", "HEAD"],
    handle: ({ req, res }) => {
      const exclude = new URL(req.url ?? "/", "http://fylr").searchParams.getAll("exclude");
      const { status, body } = readinessReport(checks, exclude);
      writeHead(res, status, { "content-type": "text/plain; charset=utf-8", "content-length": Buffer.byteLength(body), "cache-control": "no-store" });
      if (req.method === "HEAD") res.end();
      else res.end(body);
    },
  };
}
