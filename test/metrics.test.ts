import { expect } from "chai";
import { ItemState } from "../gen/slotbroker/v1/queue_pb.js";
import { createQueueClient } from "../src/api/index.js";
import { compileFylrConfig, startFylr, type FylrHandle } from "../src/app/index.js";
import { BrokerStream, closeLater, eventually, releaseAll } from "./execserver/support/broker-stream.js";
import { startTestServer } from "./execserver/support/server.js";
import { createTestDatabase } from "./support/postgres.js";
import { release, track } from "../harness/resources.js";
import { createPgPool } from "../src/shared/postgres.js";
import { readFileSync } from "node:fs";
import { metricFamilies, metricNameProblems, ownFamilies, runtimeFamilyName } from "./support/metric-names.js";
import { spawnExecserver } from "../harness/execserver-process.js";

/** One sample of the Prometheus text format. */
interface Sample {
  readonly name: string;
  readonly labels: Readonly<Record<string, string>>;
  readonly value: number;
}

/** Parses the samples of a Prometheus text exposition (label values without escapes suffice here). */
function parseMetrics(text: string): Sample[] {
  const out: Sample[] = [];
  for (const line of text.split("\n")) {
    if (line === "" || line.startsWith("#")) continue;
    const m = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$/.exec(line);
    if (!m) throw new Error(`not a sample line: ${line}`);
    const labels: Record<string, string> = {};
    for (const pair of (m[2] ?? "").matchAll(/([a-zA-Z_][a-zA-Z0-9_]*)="([^"]*)"/g)) labels[pair[1]!] = pair[2]!;
    out.push({ name: m[1]!, labels, value: Number(m[3]) });
  }
  return out;
}

/** The value of the one sample of `name` whose labels include `labels`; fails when there is none. */
function sample(samples: readonly Sample[], name: string, labels: Record<string, string> = {}): number {
  const hits = samples.filter((s) => s.name === name && Object.entries(labels).every(([k, v]) => s.labels[k] === v));
  if (hits.length !== 1) throw new Error(`${name}${JSON.stringify(labels)}: ${hits.length} samples (of ${samples.filter((s) => s.name === name).length} named so)`);
  return hits[0]!.value;
}

async function scrape(url: string): Promise<Sample[]> {
  const res = await fetch(url);
  expect(res.status).to.equal(200);
  expect(res.headers.get("content-type")).to.match(/^text\/plain; version=0\.0\.4/);
  return parseMetrics(await res.text());
}

const operatorGuide = readFileSync(new URL("../docs/operator-guide.md", import.meta.url), "utf8");

/** Every family a real /metrics serves follows the Prometheus naming rules and is documented. */
async function checkNames(url: string): Promise<void> {
  const all = metricFamilies(await (await fetch(url)).text());
  const runtime = all.filter((f) => runtimeFamilyName.test(f.name));
  for (const name of ["process_cpu_seconds_total", "process_resident_memory_bytes", "process_open_fds", "nodejs_eventloop_lag_seconds", "nodejs_heap_size_used_bytes", "nodejs_gc_duration_seconds"]) {
    expect(runtime.map((f) => f.name), "runtime families").to.include(name);
  }
  expect(operatorGuide).to.include("`process_*`").and.include("`nodejs_*`");
  const families = ownFamilies(all);
  expect(families.length).to.be.greaterThan(3);
  expect(families.flatMap((f) => metricNameProblems(f))).to.deep.equal([]);
  const undocumented = families.filter((f) => !operatorGuide.includes(`\`${f.name}\``)).map((f) => f.name);
  expect(undocumented, "metrics missing from docs/operator-guide.md").to.deep.equal([]);
}

describe("metric naming rules", () => {
  it("flag a gauge with a counter's suffix, a counter without one, non-base units and bad labels", () => {
    const f = (name: string, type: string, labels: string[] = [], help = "x") => metricNameProblems({ name, type, help, labels });
    expect(f("slotbroker_slots_total", "gauge")).to.deep.equal(["slotbroker_slots_total: a gauge must not end in _total"]);
    expect(f("slotbroker_claims", "counter")).to.deep.equal(["slotbroker_claims: a counter must end in _total"]);
    expect(f("slotbroker_latency_ms", "histogram")[0]).to.match(/non-base unit "ms"/);
    expect(f("slotbroker_x", "gauge", ["waitGroup"])[0]).to.match(/label "waitGroup"/);
    expect(f("other_x", "gauge")[0]).to.match(/does not start with "slotbroker_"/);
    expect(f("slotbroker_a:b", "gauge")[0]).to.match(/snake_case/);
    expect(f("slotbroker_x", "gauge", [], "")[0]).to.match(/no HELP/);
    expect(f("slotbroker_grant_latency_seconds", "histogram", ["waitgroup", "le"])).to.deep.equal([]);
  });

  it("read families, types and label names from a text exposition", () => {
    const text = [
      "# HELP slotbroker_h h",
      "# TYPE slotbroker_h histogram",
      'slotbroker_h_bucket{le="1",waitgroup="a"} 1',
      'slotbroker_h_count{waitgroup="a"} 1',
      "# HELP slotbroker_g g",
      "# TYPE slotbroker_g gauge",
      'slotbroker_g{state="x"} 2',
    ].join("\n");
    expect(metricFamilies(text)).to.deep.equal([
      { name: "slotbroker_h", type: "histogram", help: "h", labels: ["le", "waitgroup"] },
      { name: "slotbroker_g", type: "gauge", help: "g", labels: ["state"] },
    ]);
  });
});

describe("metrics", function () {
  this.timeout(60_000);
  afterEach(releaseAll);

  it("execserver: slots total and used per waitgroup, book depth by priority, grant latency, offer outcomes, connections", async () => {
    const server = await startTestServer({ waitgroups: { one: { processes: 1 }, two: { processes: 2 }, slow: { processes: 1 } }, offerTimeout: "300ms" });
    const a = await BrokerStream.open(server.grpcAddress, { clientName: "a" });
    for (let i = 0; i < 3; i++) {
      a.want(`g${i}`, "noop");
      a.job(`g${i}`, (await a.next("offer")).offerToken);
      await a.next("done");
    }
    const b = await BrokerStream.open(server.grpcAddress, { clientName: "b" });
    b.want("declined", "noop2");
    b.decline("declined", (await b.next("offer")).offerToken);
    b.want("expires", "noop2");
    await b.next("offer");
    await eventually(() => expect(server.status().waitgroups.find((w) => w.name === "two")!.offered).to.equal(0), 5000);
    const c = await BrokerStream.open(server.grpcAddress, { clientName: "c" });
    c.want("nap", "sleep");
    c.job("nap", (await c.next("offer")).offerToken, { args: ["60"] });
    for (const id of ["p5a", "p5b"]) c.want(id, "sleep", 5, id === "p5a" ? "tenant-1" : "tenant-2");
    c.want("p0", "sleep", 0);
    await c.ping();

    const m = await scrape(`${server.adminUrl}/metrics`);
    const id = { instance_id: "test-exec" };
    expect([1, 2, 1]).to.deep.equal(["one", "two", "slow"].map((waitgroup) => sample(m, "slotbroker_slots", { ...id, waitgroup })));
    expect(sample(m, "slotbroker_slots_used", { waitgroup: "slow", state: "running" })).to.equal(1);
    expect(sample(m, "slotbroker_slots_used", { waitgroup: "slow", state: "offered" })).to.equal(0);
    expect(sample(m, "slotbroker_slots_used", { waitgroup: "one", state: "running" })).to.equal(0);
    expect(sample(m, "slotbroker_book_depth", { waitgroup: "slow", priority: "5" })).to.equal(2);
    expect(sample(m, "slotbroker_book_depth", { waitgroup: "slow", priority: "0" })).to.equal(1);
    expect(m.filter((s) => s.name === "slotbroker_book_depth" && s.labels.waitgroup !== "slow")).to.deep.equal([]);
    expect(sample(m, "slotbroker_book_keys", { waitgroup: "slow", priority: "5" })).to.equal(2);
    expect(sample(m, "slotbroker_book_keys", { waitgroup: "slow", priority: "0" })).to.equal(1);
    // Every offer made counts once in the histogram: 3 noop, 2 noop2, 1 sleep.
    expect(sample(m, "slotbroker_grant_latency_seconds_count", { waitgroup: "one" })).to.equal(3);
    expect(sample(m, "slotbroker_grant_latency_seconds_count", { waitgroup: "two" })).to.equal(2);
    expect(sample(m, "slotbroker_grant_latency_seconds_bucket", { waitgroup: "one", le: "+Inf" })).to.equal(3);
    expect(sample(m, "slotbroker_offer_outcomes_total", { outcome: "accepted" })).to.equal(4);
    expect(sample(m, "slotbroker_offer_outcomes_total", { outcome: "declined" })).to.equal(1);
    expect(sample(m, "slotbroker_offer_outcomes_total", { outcome: "expired" })).to.equal(1);
    expect(sample(m, "slotbroker_offer_outcomes_total", { outcome: "withdrawn" })).to.equal(0);
    expect(sample(m, "slotbroker_connections", id)).to.equal(3);
    expect(sample(m, "slotbroker_jobs_done_total", { waitgroup: "one" })).to.equal(3);
    // The nap has held `slow`'s one slot since its job started; a slot of `two` ran nothing.
    const napped = sample(m, "slotbroker_slot_busy_seconds_total", { waitgroup: "slow" });
    expect(napped).to.be.greaterThan(0);
    expect(sample(m, "slotbroker_slot_busy_seconds_total", { waitgroup: "two" })).to.equal(0);
    await new Promise((r) => setTimeout(r, 200));
    const later = sample(await scrape(`${server.adminUrl}/metrics`), "slotbroker_slot_busy_seconds_total", { waitgroup: "slow" });
    expect(later - napped).to.be.within(0.15, 2);
    await checkNames(`${server.adminUrl}/metrics`);
  });

  it("a spawned execserver's /metrics carries its own process's runtime families (process_*, nodejs_*)", async () => {
    const exec = await spawnExecserver({ waitgroups: { one: { processes: 1 } }, services: { noop: { waitgroup: "one", builtin: "noop" } } });
    try {
      await checkRuntime(exec.adminAddress);
    } finally {
      await release(exec);
    }
  });

  async function checkRuntime(adminAddress: string): Promise<void> {
    const m = await scrape(`http://${adminAddress}/metrics`);
    expect(sample(m, "process_resident_memory_bytes")).to.be.greaterThan(10 * 1024 * 1024);
    expect(sample(m, "process_open_fds")).to.be.greaterThan(3);
    expect(sample(m, "nodejs_version_info", { version: process.version })).to.equal(1);
    // The child's own start, not this test process's.
    const started = sample(m, "process_start_time_seconds");
    expect(started * 1000).to.be.greaterThan(performance.timeOrigin + 1000);
    // Runtime series describe the process: no instance_id label on them.
    expect(m.filter((s) => /^(process|nodejs)_/.test(s.name) && "instance_id" in s.labels)).to.deep.equal([]);
    await checkNames(`http://${adminAddress}/metrics`);
  }

  it("fylr: pool size, claims, requeues and orphan rescues", async () => {
    const exec = await startTestServer({ waitgroups: { one: { processes: 1 }, two: { processes: 2 }, slow: { processes: 1 } } });
    const databaseUrl = await createTestDatabase("metrics");
    const db = closeLater(track(createPgPool({ connectionString: databaseUrl, max: 2 }), "metrics db", (p) => p.end()));
    // pool.end() resolves before its sockets are closed; if this is the run's last test, the
    // shared Postgres stops meanwhile and "terminating connection" must not be uncaught.
    db.on("error", () => undefined);
    const config = compileFylrConfig(
      {
        name: "metrics",
        listen: "127.0.0.1:0",
        databaseUrl,
        databasePoolSize: 4,
        execserver: { addresses: [exec.grpcAddress], retryTick: "200ms", reconnectInitial: "50ms", connectTimeout: "500ms" },
        dispatcher: { pollInterval: "100ms", heartbeatInterval: "200ms", staleAfter: "2s", stopGrace: "1s", retryInitial: "100ms" },
      },
      "test",
    );
    const fylr: FylrHandle = closeLater(track(await startFylr(config), "metrics fylr", (f) => f.forceClose()));
    const client = createQueueClient(fylr.url);
    const ok = (await client.submit({ calls: [{ service: "noop" }] })).item!.id;
    // `sleep x` exits 1: one failed attempt goes back to the queue, the second fails the item.
    await client.submit({ calls: [{ service: "sleep", args: ["x"] }], maxAttempts: 2 });
    // A claim of a fylr that died: a survivor rescues it.
    await db.query("INSERT INTO fylrs (id, hostname, pid, heartbeat_at) VALUES ('ghost', 'gone', 1, now() - interval '1 hour')");
    await db.query(
      "INSERT INTO queue_items (kind, priority, payload, state, claimed_by, lease, attempts, claimed_at) SELECT kind, priority, payload, 'claimed', 'ghost', 1, 1, now() FROM queue_items WHERE id = $1",
      [ok],
    );
    await eventually(() => expect(fylr.dispatcher.stats().counters).to.include({ succeeded: 2, failed: 1, requeued: 1, orphansRescued: 1 }), 15_000);
    // The one `slow` slot busy for a minute: the next sleep gets no slot within connectTimeout.
    await client.submit({ calls: [{ service: "sleep", args: ["60"] }] });
    await eventually(() => expect(exec.status().waitgroups.find((w) => w.name === "slow")!.running).to.equal(1), 5000);
    await client.submit({ calls: [{ service: "sleep", args: ["60"] }] });
    await eventually(() => expect(fylr.broker.stats.noSlot).to.equal(1), 5000);
    await eventually(() => expect(fylr.dispatcher.stats().counters.requeued).to.equal(2), 5000);
    // The one that got no slot is queued again (a minute out): cancelled from there.
    const queued = (await client.list({ states: [ItemState.QUEUED] })).items;
    expect(queued).to.have.length(1);
    await client.cancel({ id: queued[0]!.id });

    const m = await scrape(`${fylr.url}/metrics`);
    const id = { fylr_id: fylr.id };
    expect(sample(m, "slotbroker_fylr_claims_total", id)).to.equal(fylr.dispatcher.stats().counters.claimed);
    expect(sample(m, "slotbroker_fylr_claims_total", id)).to.be.at.least(6);
    expect(sample(m, "slotbroker_fylr_direct_claims_total", id)).to.equal(fylr.dispatcher.stats().counters.claimedDirectly);
    expect(sample(m, "slotbroker_fylr_requeues_total", id)).to.equal(2);
    expect(sample(m, "slotbroker_fylr_orphan_rescues_total", id)).to.equal(1);
    expect(sample(m, "slotbroker_fylr_succeeded_total", id)).to.equal(2);
    expect(sample(m, "slotbroker_fylr_failed_total", id)).to.equal(1);
    expect(sample(m, "slotbroker_fylr_pool_connections", { address: exec.grpcAddress, state: "ready" })).to.be.at.least(1);
    expect(sample(m, "slotbroker_fylr_instances", id)).to.equal(1);
    // Five calls got a slot (noop, two `sleep x` attempts, the rescued noop, `sleep 60`); one timed out.
    expect(sample(m, "slotbroker_fylr_offers_total", { outcome: "accepted" })).to.equal(5);
    expect(sample(m, "slotbroker_fylr_offers_total", { outcome: "declined" })).to.equal(0);
    // One execserver: no offer is ever surplus here (broker.test.ts makes one and scrapes it).
    expect(sample(m, "slotbroker_fylr_offers_substituted_total", id)).to.equal(0);
    expect(sample(m, "slotbroker_fylr_no_slot_total", id)).to.equal(1);
    // Items by how they ended and their service, their durations, the calls' slot waits, cancels.
    expect(sample(m, "slotbroker_fylr_items_finished_total", { state: "succeeded", service: "noop" })).to.equal(2);
    expect(sample(m, "slotbroker_fylr_items_finished_total", { state: "failed", service: "sleep" })).to.equal(1);
    expect(sample(m, "slotbroker_fylr_item_duration_seconds_count", { service: "noop" })).to.equal(2);
    expect(sample(m, "slotbroker_fylr_item_duration_seconds_count", { service: "sleep" })).to.equal(1);
    expect(sample(m, "slotbroker_fylr_slot_wait_seconds_count", { service: "noop" })).to.equal(2);
    expect(sample(m, "slotbroker_fylr_slot_wait_seconds_count", { service: "sleep" })).to.equal(2);
    expect(sample(m, "slotbroker_fylr_cancel_requests_total", { from: "queued" })).to.equal(1);
    expect(sample(m, "slotbroker_fylr_cancel_requests_total", { from: "running" })).to.equal(0);
    // Capacity 4 slots, one client, headroom 2.
    expect(sample(m, "slotbroker_fylr_exec_items", { kind: "admission" })).to.equal(6);
    expect(sample(m, "slotbroker_fylr_exec_items", { kind: "held" })).to.equal(fylr.dispatcher.stats().execHeld);
    // Wakeups by source, counted from the dispatcher's events: the submits, the database
    // INSERTs above (the ghost's claim) and the retry requeue reached the loop as
    // notifications (a submit wakes its own loop directly only while LISTEN is down).
    expect(sample(m, "slotbroker_fylr_listening", id)).to.equal(1);
    expect(sample(m, "slotbroker_fylr_wakeups_total", { source: "notify" })).to.be.at.least(1);
    expect(sample(m, "slotbroker_fylr_wakeups_total", { source: "submit" })).to.be.at.least(0);
    expect(sample(m, "slotbroker_fylr_wakeups_total", { source: "poll" })).to.be.at.least(0);
    // Fairness keys: bounded series only, none per key.
    expect(sample(m, "slotbroker_fylr_fairness_keys_active", id)).to.be.at.least(0);
    expect(sample(m, "slotbroker_fylr_claim_wait_seconds_count", id)).to.be.at.least(1);
    expect(m.filter((s) => s.name.startsWith("slotbroker_fylr_") && "fairness_key" in s.labels)).to.deep.equal([]);
    await checkNames(`${fylr.url}/metrics`);
  });
});
