// Migration from the token protocol, with real processes: `slotbroker execserver` children
// (broker mode with the legacy port on, or legacy-only), `slotbroker fylr` children on a
// real Postgres and the old polling client. (Two replicas behind HAProxy:
// test/ecosystem/haproxy/token-protocol.test.ts.)
import { expect } from "chai";
import type pg from "pg";
import { ItemState } from "../../gen/slotbroker/v1/queue_pb.js";
import type { FylrStatusJson } from "../../src/app/fylr-routes.js";
import { requestToken, runWithToken, type TokenAnswer } from "../../src/fylr/index.js";
import { BufferCollector } from "../../src/fylr/exec-client-sinks.js";
import { spawnExecserver, waitFor, type ExecserverProcess, type SpawnExecserverConfig } from "../../harness/execserver-process.js";
import { createTestDatabase } from "../support/postgres.js";
import { closeAll, fastFylrConfig, openPool, spawnFylr, type FylrProcess } from "./support.js";

async function metric(server: ExecserverProcess, pattern: RegExp): Promise<number> {
  const text = await (await fetch(`http://${server.adminAddress}/metrics`)).text();
  let total = 0;
  for (const line of text.split("\n")) if (pattern.test(line)) total += Number(line.slice(line.lastIndexOf(" ") + 1));
  return total;
}

async function fylrStatus(fylr: FylrProcess): Promise<FylrStatusJson> {
  return (await (await fetch(`${fylr.url}/status.json`)).json()) as FylrStatusJson;
}

async function itemsDone(pool: pg.Pool): Promise<{ succeeded: number; other: number }> {
  const r = await pool.query<{ state: string; n: number }>("SELECT state, count(*)::int AS n FROM queue_items GROUP BY state");
  let succeeded = 0;
  let other = 0;
  for (const row of r.rows) row.state === "succeeded" ? (succeeded += row.n) : (other += row.n);
  return { succeeded, other };
}

const services: SpawnExecserverConfig["services"] = {
  sleep: { waitgroup: "w", command: ["sleep"] },
  cat: { waitgroup: "w", command: ["cat"] },
};

describe("migration from the token protocol (real processes)", function () {
  this.timeout(120_000);
  let databaseUrl: string;
  let pool: pg.Pool;
  let execs: ExecserverProcess[] = [];
  let fylrs: FylrProcess[] = [];

  // A fresh database per test: the first fylr of each migrates it.
  beforeEach(async () => {
    databaseUrl = await createTestDatabase("migration");
    pool = openPool(databaseUrl);
  });
  afterEach(async () => {
    await closeAll(...fylrs, ...execs, pool);
    fylrs = [];
    execs = [];
  });

  it("an old polling client gets 503 while a new fylr has wants parked, and is served once the book is empty", async () => {
    const exec = await spawnExecserver({ instanceId: "exec-both", waitgroups: { w: { processes: 2 } }, services, legacy: { enabled: true } });
    execs.push(exec);
    // Headroom enough to claim every item at once: 2 run, the other 6 park their wants.
    const fylr = await spawnFylr(fastFylrConfig(databaseUrl, [exec.grpcAddress], { dispatcher: { headroom: 10 } }), "new-fylr");
    fylrs.push(fylr);
    await waitFor("the fylr connected", async () => (await exec.status()).connections.length === 1);
    for (let i = 0; i < 8; i++) await fylr.client.submit({ calls: [{ service: "sleep", args: ["0.4"] }] });
    await waitFor("wants parked", async () => Number((await exec.status()).waitgroups[0]!.waiting) > 0);

    const endpoint = { url: new URL(`http://${exec.legacyAddress}`) };
    const answers: { answer: TokenAnswer; waitingAfter: number }[] = [];
    let grant: Extract<TokenAnswer, { kind: "token" }>["grant"] | undefined;
    while (!grant) {
      const answer = await requestToken(endpoint, "sleep");
      const waitingAfter = Number((await exec.status()).waitgroups[0]!.waiting);
      answers.push({ answer, waitingAfter });
      if (answer.kind === "token") grant = answer.grant;
      // A token-protocol client's own poll interval (the old behaviour under test), not a wait for a state.
      else await new Promise((r) => setTimeout(r, 100));
    }
    // The book only shrinks here (every item was claimed at once), so a GET followed by a
    // non-empty book met a non-empty book: it must have been refused because of it.
    const whileParked = answers.filter((a) => a.waitingAfter > 0);
    expect(whileParked.length, JSON.stringify(answers.map((a) => a.answer))).to.be.at.least(3);
    for (const { answer } of whileParked) expect(answer).to.deep.include({ kind: "busy", reason: "wants-parked" });
    expect(answers.at(-1)!.waitingAfter).to.equal(0);
    // Served: the token runs a job like the old transport did.
    const receipt = await runWithToken(endpoint, grant.token, { args: ["0.1"] }, undefined, new BufferCollector());
    expect(receipt).to.include({ exitCode: 0, instanceId: "exec-both" });
    await waitFor("the fylr's items to finish", async () => (await itemsDone(pool)).succeeded === 8, 30_000, 200);
    expect(await metric(exec, /^slotbroker_legacy_refused_total\{reason="wants-parked"/)).to.be.at.least(3);
  });

  it("a new fylr runs jobs by polling a legacy-only execserver and returns to the broker when it restarts in broker mode", async () => {
    const config = (brokerService: boolean): SpawnExecserverConfig => ({ instanceId: brokerService ? "exec-new" : "exec-old", waitgroups: { w: { processes: 2 } }, services, brokerService });
    const exec = await spawnExecserver(config(false));
    execs.push(exec);
    expect(exec.legacyAddress).to.equal(exec.grpcAddress);
    const fylr = await spawnFylr(fastFylrConfig(databaseUrl, [exec.grpcAddress], { execserver: { addresses: [exec.grpcAddress], polling: { reprobe: "500ms" } } }), "migrating");
    fylrs.push(fylr);
    await waitFor("the fylr to poll the old execserver", async () => (await fylrStatus(fylr)).execservers.transports[exec.grpcAddress] === "polling");

    const submit = async (n: number, tag: string): Promise<string[]> => {
      const ids: string[] = [];
      for (let i = 0; i < n; i++) {
        const data = Buffer.from(`${tag} ${i}\n`);
        ids.push((await fylr.client.submit({ calls: [{ service: "cat", stdin: { case: "stdinData", value: data } }] })).item!.id);
      }
      return ids;
    };
    const outputs = async (ids: string[]): Promise<string[]> => {
      const out: string[] = [];
      for (const id of ids) {
        const { item } = await fylr.client.get({ id });
        expect(item?.state, item?.error).to.equal(ItemState.SUCCEEDED);
        out.push(Buffer.from(item!.output).toString());
      }
      return out;
    };
    const polled = await submit(5, "polled");
    await waitFor("the polled items to finish", async () => (await itemsDone(pool)).succeeded === 5, 30_000, 200);
    expect(await outputs(polled)).to.deep.equal([0, 1, 2, 3, 4].map((i) => `polled ${i}\n`));
    expect(await metric(exec, /^slotbroker_legacy_jobs_done_total/)).to.equal(5);
    expect(await metric(exec, /^slotbroker_legacy_requests_total\{endpoint="job",code="200"/)).to.equal(5);

    await exec.restart("SIGTERM", config(true));
    await waitFor("the fylr back on the broker", async () => (await fylrStatus(fylr)).execservers.transports[exec.grpcAddress] === "broker", 20_000, 100);
    await waitFor("the fylr's stream", async () => (await exec.status()).connections.length === 1);
    const brokered = await submit(5, "brokered");
    await waitFor("the brokered items to finish", async () => (await itemsDone(pool)).succeeded === 10, 30_000, 200);
    expect(await outputs(brokered)).to.deep.equal([0, 1, 2, 3, 4].map((i) => `brokered ${i}\n`));
    const status = await exec.status();
    expect(status.legacy).to.equal(undefined);
    expect(Number(status.connections[0]!.grants)).to.equal(5);
    expect(await metric(exec, /^slotbroker_frames_received_total\{kind="job"/)).to.equal(5);
    const after = await fylrStatus(fylr);
    expect(after.execservers.instances.map((i) => [i.instanceId, i.transport])).to.deep.equal([["exec-new", "broker"]]);
  });

  it("a fylr serves every item from a mixed fleet: one broker execserver and one legacy-only", async () => {
    const fresh = await spawnExecserver({ instanceId: "mixed-new", waitgroups: { w: { processes: 2 } }, services });
    const old = await spawnExecserver({ instanceId: "mixed-old", waitgroups: { w: { processes: 2 } }, services, brokerService: false });
    execs.push(fresh, old);
    const addresses = [fresh.grpcAddress, old.grpcAddress];
    const fylr = await spawnFylr(fastFylrConfig(databaseUrl, addresses, { execserver: { addresses, polling: { interval: "250ms" } } }), "mixed");
    fylrs.push(fylr);
    await waitFor("one address polled, one brokered", async () => {
      const t = (await fylrStatus(fylr)).execservers.transports;
      return t[fresh.grpcAddress] === "broker" && t[old.grpcAddress] === "polling";
    });
    const ids: string[] = [];
    for (let i = 0; i < 20; i++) ids.push((await fylr.client.submit({ calls: [{ service: "sleep", args: ["0.3"] }] })).item!.id);
    await waitFor("every item to finish", async () => (await itemsDone(pool)).succeeded === 20, 60_000, 200);
    expect((await itemsDone(pool)).other).to.equal(0);
    const brokered = Number((await fresh.status()).waitgroups[0]!.completed);
    const polled = await metric(old, /^slotbroker_legacy_jobs_done_total/);
    expect(brokered + polled).to.equal(20);
    expect(brokered, `broker ${brokered}, polled ${polled}`).to.be.at.least(1);
    expect(polled, `broker ${brokered}, polled ${polled}`).to.be.at.least(1);
  });
});
