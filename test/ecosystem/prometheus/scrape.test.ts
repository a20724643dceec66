// The /metrics of a real fylr and a real execserver that have run items to every final
// state, checked by outside tools: `promtool check metrics` (Prometheus's own linter, built
// from source with Go) must find nothing, and every metric the Grafana dashboard in
// deploy/grafana queries must be one they export. The project's own naming checks run in
// test/metrics.test.ts.
import { expect } from "chai";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { ItemState } from "../../../gen/slotbroker/v1/queue_pb.js";
import { followItem } from "../../../src/api/index.js";
import { spawnExecserver, type ExecserverProcess } from "../../../harness/execserver-process.js";
import { metricFamilies, type MetricFamily } from "../../support/metric-names.js";
import { createTestDatabase } from "../../support/postgres.js";
import { inState, watchUntil } from "../../support/watch-item.js";
import { closeAll, fastFylrConfig, root, spawnFylr, type FylrProcess } from "../../integration/support.js";
import { goTools, run } from "../polyglot/support.js";

// PromQL's functions, aggregations and keywords, and Grafana's label_values: every other
// bare name in a query is a metric.
const promqlWords = new Set(
  [
    "sum avg min max count stddev stdvar topk bottomk quantile count_values group",
    "rate irate increase delta idelta deriv histogram_quantile abs ceil floor round clamp clamp_min clamp_max",
    "avg_over_time max_over_time min_over_time sum_over_time count_over_time last_over_time time vector scalar",
    "by without on ignoring group_left group_right and or unless bool offset label_values",
  ]
    .join(" ")
    .split(" "),
);

/** The metric names a PromQL expression (or a Grafana `label_values(…)` query) reads. */
function metricNamesIn(expr: string): string[] {
  const bare = expr
    .replace(/"(?:[^"\\]|\\.)*"/g, '""')
    .replace(/\{[^}]*\}/g, "")
    .replace(/\[[^\]]*\]/g, "")
    .replace(/\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)/g, "")
    .replace(/,\s*[a-zA-Z_][a-zA-Z0-9_]*\s*\)/g, ")") // label_values(metric, label)
    .replace(/\$\w+/g, "");
  return (bare.match(/[a-zA-Z_:][a-zA-Z0-9_:]*/g) ?? []).filter((name) => !promqlWords.has(name));
}

/** Every query of a dashboard: its panels' targets and its query variables. */
function dashboardQueries(dashboard: { panels: { targets?: { expr: string }[] }[]; templating: { list: { type: string; query: unknown }[] } }): string[] {
  const panels = dashboard.panels.flatMap((p) => (p.targets ?? []).map((t) => t.expr));
  const variables = dashboard.templating.list.filter((v) => v.type === "query").map((v) => (v.query as { query: string }).query);
  return [...panels, ...variables];
}

// A series name as the families define it: a histogram's _bucket, _sum and _count are its own.
function exported(name: string, families: ReadonlyMap<string, MetricFamily>): boolean {
  if (families.has(name)) return true;
  const m = /^(.*)_(bucket|sum|count)$/.exec(name);
  return m !== null && families.get(m[1]!)?.type === "histogram";
}

describe("the /metrics of a real fylr and execserver", function () {
  this.timeout(600_000);
  let promtool: string;
  let exec: ExecserverProcess;
  let fylr: FylrProcess;
  const scrapes = new Map<string, string>();

  before(async function () {
    promtool = join(await goTools(), "promtool");
    exec = await spawnExecserver({
      waitgroups: { text: { processes: 2 } },
      services: { wc: { waitgroup: "text", command: ["wc", "-c"] }, fail: { waitgroup: "text", command: ["false"] }, sleep: { waitgroup: "text", command: ["sleep", "30"] } },
    });
    fylr = await spawnFylr(fastFylrConfig(await createTestDatabase("scrape"), [exec.grpcAddress]), "scrape");
    // Items to every final state, so each family has its series: succeeded, failed, cancelled.
    const { client } = fylr;
    const ok = (await client.submit({ calls: [{ service: "wc", stdin: { case: "stdinData", value: Buffer.from("hello") } }] })).item!;
    const failed = (await client.submit({ calls: [{ service: "fail" }], maxAttempts: 1 })).item!;
    const sleeping = (await client.submit({ calls: [{ service: "sleep" }] })).item!;
    expect((await followItem(client, ok.id)).state).to.equal(ItemState.SUCCEEDED);
    expect((await followItem(client, failed.id)).state).to.equal(ItemState.FAILED);
    await watchUntil(client, sleeping.id, "the sleep running", inState(ItemState.RUNNING));
    await client.cancel({ id: sleeping.id });
    expect((await followItem(client, sleeping.id)).state).to.equal(ItemState.CANCELLED);
    for (const [what, url] of [
      ["fylr", `${fylr.url}/metrics`],
      ["execserver", `http://${exec.adminAddress}/metrics`],
    ]) {
      const res = await fetch(url!);
      expect(res.status).to.equal(200);
      scrapes.set(what!, await res.text());
    }
  });

  after(() => closeAll(fylr, exec));

  for (const what of ["fylr", "execserver"]) {
    it(`promtool check metrics finds nothing on the ${what}'s /metrics`, async () => {
      const checked = await run(promtool, ["check", "metrics"], { input: scrapes.get(what)! });
      expect(checked.stdout + checked.stderr).to.equal("");
      expect(checked.code).to.equal(0);
    });
  }

  it("the Grafana dashboard queries only metrics they export", () => {
    const families = new Map([...scrapes.values()].flatMap((text) => metricFamilies(text)).map((f) => [f.name, f]));
    const dashboard = JSON.parse(readFileSync(join(root, "deploy/grafana/slotbroker.json"), "utf8")) as Parameters<typeof dashboardQueries>[0];
    const queries = dashboardQueries(dashboard);
    expect(queries.length).to.be.greaterThan(10);
    const used = new Set(queries.flatMap(metricNamesIn));
    expect([...used].filter((name) => !exported(name, families))).to.deep.equal([]);
    // What the dashboard is for: items by end and service, their durations and slot waits, utilisation, cancels.
    for (const name of [
      "slotbroker_fylr_items_finished_total",
      "slotbroker_fylr_item_duration_seconds_bucket",
      "slotbroker_fylr_slot_wait_seconds_bucket",
      "slotbroker_slot_busy_seconds_total",
      "slotbroker_fylr_cancel_requests_total",
    ]) {
      expect([...used]).to.include(name);
    }
  });

  it("reads the metric names out of PromQL, so a misspelt one is caught", () => {
    expect(metricNamesIn('histogram_quantile(0.95, sum by (service, le) (rate(slotbroker_x_bucket{service=~"$service"}[$__rate_interval])))')).to.deep.equal([
      "slotbroker_x_bucket",
    ]);
    expect(metricNamesIn("sum by (waitgroup) (rate(a_total[5m])) / sum by (waitgroup) (b)")).to.deep.equal(["a_total", "b"]);
    expect(metricNamesIn("label_values(slotbroker_slots, waitgroup)")).to.deep.equal(["slotbroker_slots"]);
    const families = new Map(metricFamilies(scrapes.get("execserver")!).map((f) => [f.name, f]));
    expect(exported("slotbroker_grant_latency_seconds_bucket", families)).to.equal(true);
    expect(exported("slotbroker_slots_bucket", families)).to.equal(false);
    expect(exported("slotbroker_slot_busy_second_total", families)).to.equal(false);
  });
});
