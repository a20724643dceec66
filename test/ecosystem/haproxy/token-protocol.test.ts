// The token protocol's weakness behind a load balancer, with real processes: two
// `slotbroker execserver` replicas with their legacy ports behind one HAProxy address. The
// old polling client's token is sometimes redeemed at the replica that did not issue it
// ("token not found"); the broker path through the same balancer never fails that way.
import { expect } from "chai";
import { LegacyClient, TokenNotFoundError } from "../../../src/fylr/index.js";
import { spawnExecserver, waitFor, type ExecserverProcess, type SpawnExecserverConfig } from "../../../harness/execserver-process.js";
import { startReplica, stopReplica, type FylrReplica } from "../../support/fylr-replica.js";
import { startHaproxyFrontends } from "../../../harness/haproxy.js";
import { release } from "../../../harness/resources.js";
import { closeAll } from "../../integration/support.js";

async function metric(server: ExecserverProcess, pattern: RegExp): Promise<number> {
  const text = await (await fetch(`http://${server.adminAddress}/metrics`)).text();
  let total = 0;
  for (const line of text.split("\n")) if (pattern.test(line)) total += Number(line.slice(line.lastIndexOf(" ") + 1));
  return total;
}

const services: SpawnExecserverConfig["services"] = { cat: { waitgroup: "w", command: ["cat"] } };

describe("two execserver replicas behind HAProxy (real processes)", function () {
  this.timeout(120_000);
  const execs: ExecserverProcess[] = [];
  const replicas: FylrReplica[] = [];
  afterEach(async () => {
    for (const replica of replicas.splice(0)) await stopReplica(replica);
    await closeAll(...execs.splice(0));
  });

  it("a token redeemed at the wrong replica fails with 'token not found'; the broker path through the same HAProxy never does", async () => {
    const replicaConfig = (id: string): SpawnExecserverConfig => ({
      instanceId: id,
      waitgroups: { w: { processes: 2 } },
      services,
      legacy: { enabled: true, listen: "127.0.0.1:0", tokenTtl: "1s" },
    });
    const [a, b] = [await spawnExecserver(replicaConfig("replica-a")), await spawnExecserver(replicaConfig("replica-b"))];
    execs.push(a, b);
    const lb = await startHaproxyFrontends({ grpc: [a.grpcAddress, b.grpcAddress], legacy: [a.legacyAddress!, b.legacyAddress!] });

    // The old transport: GET /token and PUT /job each on a connection of their own, so the
    // balancer may send the PUT to the replica that did not issue the token.
    const legacy = new LegacyClient({ endpoints: [{ url: new URL(`http://${lb.addresses.legacy}`) }], pollIntervalMs: 100, connectTimeoutMs: 10_000 });
    const outcomes: string[] = [];
    for (let i = 0; i < 6; i++) {
      try {
        const r = await legacy.run({ service: "cat", stdin: Buffer.from(`legacy ${i}\n`) });
        outcomes.push(r.stdout!.toString() === `legacy ${i}\n` ? "ok" : "wrong output");
      } catch (err) {
        outcomes.push(err instanceof TokenNotFoundError ? "token not found" : `other: ${(err as Error).message}`);
      }
    }
    expect(outcomes.filter((o) => o === "token not found").length, outcomes.join(", ")).to.be.at.least(1);
    expect(outcomes.filter((o) => o.startsWith("other") || o === "wrong output"), outcomes.join(", ")).to.deep.equal([]);
    const notFound = (await metric(a, /^slotbroker_legacy_refused_total\{reason="token-not-found"/)) + (await metric(b, /^slotbroker_legacy_refused_total\{reason="token-not-found"/));
    expect(notFound).to.equal(outcomes.filter((o) => o === "token not found").length);
    // Each orphaned token held a slot on the replica that issued it until its TTL ran out.
    await waitFor("the orphaned tokens to expire", async () => (await metric(a, /^slotbroker_legacy_tokens_total\{outcome="expired"/)) + (await metric(b, /^slotbroker_legacy_tokens_total\{outcome="expired"/)) === notFound, 10_000, 100);

    // The broker path through the same balancer: reservation, job and receipt ride one stream.
    const replica = await startReplica({ addresses: [lb.addresses.grpc!], clientName: "via-lb", polling: { enabled: false } }, "via-lb");
    replicas.push(replica);
    const results = await Promise.all(Array.from({ length: 12 }, (_, i) => replica.exec.run({ service: "cat", stdin: Buffer.from(`broker ${i}\n`) })));
    results.forEach((r, i) => {
      expect(r.transport).to.equal("broker");
      expect(r.stdout!.toString()).to.equal(`broker ${i}\n`);
    });
    const notFoundAfter = (await metric(a, /^slotbroker_legacy_refused_total\{reason="token-not-found"/)) + (await metric(b, /^slotbroker_legacy_refused_total\{reason="token-not-found"/));
    expect(notFoundAfter).to.equal(notFound);
    await release(lb);
  });
});
