// One item, one trace, across real processes: a minimal OpenTelemetry Collector (the
// collector's OTLP receiver, built with Go) receives the spans of fylr A (where the item is
// submitted), fylr B (which claims and runs it: A reaches no execserver, so it claims
// nothing) and the execserver, all over OTLP/HTTP as configured by the standard OTEL_*
// variables. The job prints the TRACEPARENT it was given; a retried item's attempts stay
// in its trace.
import { expect } from "chai";
import { randomBytes } from "node:crypto";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { setTimeout } from "node:timers/promises";
import { ItemState } from "../../../gen/slotbroker/v1/queue_pb.js";
import { spawnExecserver, type ExecserverProcess } from "../../../harness/execserver-process.js";
import { createTestDatabase } from "../../support/postgres.js";
import { inState, watchUntil } from "../../support/watch-item.js";
import { closeAll, fastFylrConfig, spawnFylr, type FylrProcess } from "../../integration/support.js";
import { startTrackedReceiver, type OtlpReceiver, type ReceivedSpan } from "./support.js";

const otel = (receiver: OtlpReceiver, service: string): NodeJS.ProcessEnv => ({
  OTEL_TRACES_EXPORTER: "otlp",
  OTEL_EXPORTER_OTLP_ENDPOINT: receiver.endpoint,
  OTEL_SERVICE_NAME: service,
  OTEL_TRACES_SAMPLER: "parentbased_always_on",
  OTEL_BSP_SCHEDULE_DELAY: "100",
});

describe("traces against a real OpenTelemetry collector", function () {
  this.timeout(120_000);
  let receiver: OtlpReceiver;
  let exec: ExecserverProcess;
  let fylrA: FylrProcess;
  let fylrB: FylrProcess;
  let dir: string;

  before(async function () {
    this.timeout(660_000);
    receiver = await startTrackedReceiver();
    dir = mkdtempSync(join(tmpdir(), "slotbroker-traces-"));
    const databaseUrl = await createTestDatabase("traces");
    exec = await spawnExecserver(
      {
        instanceId: "trace-exec",
        waitgroups: { w: { processes: 2 } },
        services: {
          tp: { waitgroup: "w", command: ["sh", "-c", 'printf %s "$TRACEPARENT"'] },
          // Fails while its marker file is missing, which it creates: the second attempt succeeds.
          flaky: { waitgroup: "w", command: ["sh", "-c", 'if [ -e "$1" ]; then echo ok; else : > "$1"; exit 3; fi', "flaky"] },
        },
      },
      // debug: a line per finished job, which carries the job span's ids.
      { env: otel(receiver, "trace-exec"), logLevel: "debug" },
    );
    // A reaches no execserver (nothing listens on port 1): it sees no slot and claims nothing.
    fylrA = await spawnFylr(fastFylrConfig(databaseUrl, ["127.0.0.1:1"]), "trace-a", { env: otel(receiver, "fylr-a") });
    fylrB = await spawnFylr(fastFylrConfig(databaseUrl, [exec.grpcAddress]), "trace-b", { env: otel(receiver, "fylr-b") });
  });

  after(async () => {
    await closeAll(fylrA, fylrB, exec, receiver);
    rmSync(dir, { recursive: true, force: true });
  });

  // The exporters batch (OTEL_BSP_SCHEDULE_DELAY): spans arrive a little after the item ended.
  async function traceOf(traceId: string, names: readonly string[]): Promise<ReceivedSpan[]> {
    const deadline = Date.now() + 20_000;
    for (;;) {
      const spans = receiver.spans().filter((s) => s.traceId === traceId);
      if (names.every((n) => spans.some((s) => s.name === n))) return spans;
      if (Date.now() > deadline) {
        throw new Error(`spans ${names.join(", ")} of trace ${traceId}; received ${spans.map((s) => `${s.service}/${s.name}`).join(", ") || "none"}`);
      }
      await setTimeout(100);
    }
  }

  const one = (spans: readonly ReceivedSpan[], name: string): ReceivedSpan => {
    const found = spans.filter((s) => s.name === name);
    expect(found, name).to.have.length(1);
    return found[0]!;
  };

  it("submitted on fylr A, claimed by fylr B, run on the execserver: one trace, every span under the caller's", async () => {
    const traceId = randomBytes(16).toString("hex");
    const callerSpan = randomBytes(8).toString("hex");
    const { item } = await fylrA.client.submit({ calls: [{ service: "tp" }] }, { headers: { traceparent: `00-${traceId}-${callerSpan}-01` } });
    const done = await watchUntil(fylrA.client, item!.id, "the item's success", inState(ItemState.SUCCEEDED, ItemState.FAILED));
    expect(done.item?.state, done.item?.error).to.equal(ItemState.SUCCEEDED);

    const spans = await traceOf(traceId, ["slotbroker.submit", "slotbroker.queued", "slotbroker.claim", "slotbroker.call", "slotbroker.slot_wait", "slotbroker.job", "slotbroker.settle"]);
    const submit = one(spans, "slotbroker.submit");
    const queued = one(spans, "slotbroker.queued");
    const claim = one(spans, "slotbroker.claim");
    const call = one(spans, "slotbroker.call");
    const wait = one(spans, "slotbroker.slot_wait");
    const job = one(spans, "slotbroker.job");
    const settle = one(spans, "slotbroker.settle");

    expect(submit).to.deep.include({ service: "fylr-a", parentSpanId: callerSpan });
    // Get (and Watch) name the trace: the Submit span's traceparent.
    expect(done.item?.traceparent).to.equal(`00-${traceId}-${submit.spanId}-01`);
    expect(submit.attributes).to.deep.include({ "slotbroker.item.id": item!.id, "slotbroker.service": "tp", "slotbroker.item.created": true });
    for (const span of [queued, claim, call, wait, settle]) expect(span.service, span.name).to.equal("fylr-b");
    expect(queued.parentSpanId).to.equal(submit.spanId);
    expect(claim.parentSpanId).to.equal(submit.spanId);
    expect(claim.attributes).to.deep.include({ "slotbroker.item.id": item!.id, "slotbroker.attempt": 1, "slotbroker.fylr": fylrB.id, "slotbroker.outcome": "succeeded" });
    expect(call.parentSpanId).to.equal(claim.spanId);
    expect(call.attributes).to.deep.include({ "slotbroker.service": "tp", "slotbroker.execserver": "trace-exec", "process.exit.code": 0 });
    expect(wait.parentSpanId).to.equal(call.spanId);
    expect(wait.attributes).to.deep.include({ "slotbroker.waitgroup": "w", "slotbroker.execserver": "trace-exec" });
    expect(settle.parentSpanId).to.equal(claim.spanId);

    expect(job).to.deep.include({ service: "trace-exec", parentSpanId: call.spanId });
    expect(job.attributes).to.deep.include({ "slotbroker.service": "tp", "slotbroker.waitgroup": "w", "slotbroker.execserver": "trace-exec", "process.exit.code": 0 });
    expect(job.attributes["slotbroker.job.stdout_bytes"]).to.equal(55);
    // The job continued the trace from its environment: its TRACEPARENT names the job span.
    expect(Buffer.from(done.item!.output).toString()).to.equal(`00-${traceId}-${job.spanId}-01`);
    // The execserver's line about the finished job carries the job span's ids.
    const jobLines = exec
      .stderr()
      .split("\n")
      .filter((line) => line.includes(`"trace_id":"${traceId}"`));
    expect(jobLines, exec.stderr().slice(-2000)).to.have.length.greaterThan(0);
    expect(jobLines.every((line) => line.includes(`"span_id":"${job.spanId}"`))).to.equal(true);
  });

  it("a retried item keeps its trace: each attempt's queued time and claim under the same submit", async () => {
    const traceId = randomBytes(16).toString("hex");
    const marker = join(dir, "flaky-ran");
    const { item } = await fylrA.client.submit(
      { calls: [{ service: "flaky", args: [marker] }], maxAttempts: 2 },
      { headers: { traceparent: `00-${traceId}-${randomBytes(8).toString("hex")}-01` } },
    );
    const done = await watchUntil(fylrA.client, item!.id, "the retried item's success", inState(ItemState.SUCCEEDED, ItemState.FAILED));
    expect(done.item?.state, done.item?.error).to.equal(ItemState.SUCCEEDED);
    let spans: ReceivedSpan[] = [];
    const deadline = Date.now() + 20_000;
    while ((spans = await traceOf(traceId, ["slotbroker.submit", "slotbroker.settle"])).filter((s) => s.name === "slotbroker.settle").length < 2) {
      expect(Date.now(), "two settles").to.be.below(deadline);
      await setTimeout(100);
    }
    const submit = one(spans, "slotbroker.submit");
    const claims = spans.filter((s) => s.name === "slotbroker.claim").sort((x, y) => Number(x.attributes["slotbroker.attempt"]) - Number(y.attributes["slotbroker.attempt"]));
    expect(claims.map((c) => [c.parentSpanId, c.attributes["slotbroker.attempt"], c.attributes["slotbroker.outcome"]])).to.deep.equal([
      [submit.spanId, 1, "failed"],
      [submit.spanId, 2, "succeeded"],
    ]);
    expect(claims[0]!.status.code, "the failed attempt's status").to.equal(2);
    // The task's line about the failed attempt carries the trace and that attempt's claim span.
    const retryLines = fylrB
      .stderr()
      .split("\n")
      .filter((line) => line.includes("attempt failed; will retry") && line.includes(item!.id));
    expect(retryLines, fylrB.stderr().slice(-2000)).to.have.length(1);
    expect(retryLines[0]).to.include(`"trace_id":"${traceId}"`).and.include(`"span_id":"${claims[0]!.spanId}"`);
    const queued = spans.filter((s) => s.name === "slotbroker.queued");
    expect(queued.map((q) => [q.parentSpanId, q.attributes["slotbroker.attempt"]]).sort()).to.deep.equal([
      [submit.spanId, 1],
      [submit.spanId, 2],
    ]);
    const jobs = spans.filter((s) => s.name === "slotbroker.job");
    expect(jobs.map((j) => j.attributes["process.exit.code"]).sort()).to.deep.equal([0, 3]);
  });

  it("a malformed traceparent header starts a new trace; the item runs as ever", async () => {
    const { item } = await fylrA.client.submit({ calls: [{ service: "tp" }] }, { headers: { traceparent: "00-not-a-trace-01" } });
    const done = await watchUntil(fylrA.client, item!.id, "the item's success", inState(ItemState.SUCCEEDED, ItemState.FAILED));
    expect(done.item?.state, done.item?.error).to.equal(ItemState.SUCCEEDED);
    const traceparent = Buffer.from(done.item!.output).toString();
    const [, traceId, jobSpan] = /^00-([0-9a-f]{32})-([0-9a-f]{16})-01$/.exec(traceparent) ?? [];
    expect(traceId, traceparent).to.be.a("string");
    const spans = await traceOf(traceId!, ["slotbroker.submit", "slotbroker.job"]);
    expect(one(spans, "slotbroker.submit").parentSpanId).to.equal("");
    expect(one(spans, "slotbroker.job").spanId).to.equal(jobSpan);
  });
});
