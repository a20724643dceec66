// `promtool check metrics` (Prometheus's own linter, built from source with Go) on the
// /metrics of a real fylr and a real execserver that have run items to every final state:
// it must find nothing. The project's own naming checks run in test/metrics.test.ts.
import { expect } from "chai";
import { join } from "node:path";
import { ItemState } from "../../../gen/slotbroker/v1/queue_pb.js";
import { followItem } from "../../../src/api/index.js";
import { spawnExecserver, type ExecserverProcess } from "../../../harness/execserver-process.js";
import { createTestDatabase } from "../../support/postgres.js";
import { inState, watchUntil } from "../../support/watch-item.js";
import { closeAll, fastFylrConfig, spawnFylr, type FylrProcess } from "../../integration/support.js";
import { goTools, run } from "../polyglot/support.js";

describe("promtool check metrics", function () {
  this.timeout(600_000);
  let promtool: string;
  let exec: ExecserverProcess;
  let fylr: FylrProcess;

  before(async function () {
    promtool = join(await goTools(), "promtool");
    exec = await spawnExecserver({
      waitgroups: { text: { processes: 2 } },
      services: { wc: { waitgroup: "text", command: ["wc", "-c"] }, fail: { waitgroup: "text", command: ["false"] }, sleep: { waitgroup: "text", command: ["sleep", "30"] } },
    });
    fylr = await spawnFylr(fastFylrConfig(await createTestDatabase("promtool"), [exec.grpcAddress]), "promtool");
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
  });

  after(() => closeAll(fylr, exec));

  for (const [what, url] of [
    ["the fylr's", () => `${fylr.url}/metrics`],
    ["the execserver's", () => `http://${exec.adminAddress}/metrics`],
  ] as const) {
    it(`finds nothing on ${what} /metrics`, async () => {
      const res = await fetch(url());
      expect(res.status).to.equal(200);
      const text = await res.text();
      const checked = await run(promtool, ["check", "metrics"], { input: text });
      expect(checked.stdout + checked.stderr).to.equal("");
      expect(checked.code).to.equal(0);
    });
  }
});
