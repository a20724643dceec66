import { expect } from "chai";
import { BrokerStream, releaseAll } from "./support/broker-stream.js";
import { startTestServer } from "./support/server.js";

// This process records no traces: the execserver hands the job the traceparent it got.
const printTraceparent = ["sh", "-c", 'printf %s "${TRACEPARENT-unset}"'];
const sample = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";

describe("execserver: Job.traceparent", () => {
  afterEach(() => releaseAll());

  async function run(traceparent: string, env: Record<string, string> = {}): Promise<string> {
    const s = await startTestServer({ waitgroups: { w: { processes: 1 } }, services: { tp: { waitgroup: "w", command: printTraceparent, env: ["TRACEPARENT"] } } });
    const stream = await BrokerStream.open(s.grpcAddress);
    stream.want("j1", "tp");
    const offer = await stream.next("offer");
    stream.job("j1", offer.offerToken, { env }, traceparent);
    const done = await stream.next("done");
    expect(done.receipt?.exitCode).to.equal(0);
    return Buffer.from(done.receipt!.stdoutPrefix).toString();
  }

  it("is handed to the job as TRACEPARENT, replacing one the spec's env set", async () => {
    expect(await run(sample)).to.equal(sample);
    expect(await run(sample, { TRACEPARENT: "00-11111111111111111111111111111111-2222222222222222-01" })).to.equal(sample);
  });

  it("is ignored when malformed: the job runs without it", async () => {
    for (const bad of ["garbage", sample.toUpperCase(), `${sample}-x`, "\u00e9".repeat(300)]) expect(await run(bad), bad).to.equal("unset");
  });

  it("leaves the job's environment alone when absent", async () => {
    expect(await run("")).to.equal("unset");
    expect(await run("", { TRACEPARENT: "mine" })).to.equal("mine");
  });
});
