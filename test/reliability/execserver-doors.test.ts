// Findings 5 and 7 at the execserver, with real processes: its admin port follows the
// gRPC port's token rule (no non-loopback address without a token; connection details
// only with the token) and, like every HTTP listener, closes slow-header and idle
// connections and caps their number.
import { connect, type Socket } from "node:net";
import { expect } from "chai";
import { spawnExecserver, waitFor, type ExecserverProcess } from "../../harness/execserver-process.js";
import { release } from "../../harness/resources.js";
import { RejectCode } from "../../gen/slotbroker/v1/broker_pb.js";
import { BrokerStream, releaseAll } from "../execserver/support/broker-stream.js";

const services = { echo: { waitgroup: "w", command: ["echo"] } };
const waitgroups = { w: { processes: 1 } };

describe("reliability: the execserver's admin port", () => {
  let exec: ExecserverProcess | undefined;
  const sockets: Socket[] = [];
  afterEach(async () => {
    for (const s of sockets.splice(0)) s.destroy();
    await release(exec);
    exec = undefined;
  });

  it("finding 7: refuses to start on a non-loopback admin address without a token", async function () {
    this.timeout(30_000);
    let error: Error | undefined;
    await spawnExecserver({ waitgroups, services, adminListen: "0.0.0.0:0" }, { startTimeoutMs: 15_000 })
      .then((p) => (exec = p))
      .catch((err: Error) => (error = err));
    expect(error?.message).to.match(/token: required when adminListen \(0\.0\.0\.0:\d+\) is not a loopback address/);
  });

  it("finding 7: with a token, connection details need it; health and liveness do not", async function () {
    this.timeout(30_000);
    exec = await spawnExecserver({ waitgroups, services, token: "s3cret-token" });
    const base = `http://${exec.adminAddress}`;
    for (const path of ["/status.json", "/", "/status"]) {
      const anonymous = await fetch(`${base}${path}`);
      expect(anonymous.status, path).to.equal(401);
      expect(await anonymous.text()).not.to.match(/s3cret/);
      const wrong = await fetch(`${base}${path}`, { headers: { authorization: "Bearer nope" } });
      expect(wrong.status, path).to.equal(401);
      const right = await fetch(`${base}${path}`, { headers: { authorization: "Bearer s3cret-token" } });
      expect(right.status, path).to.equal(200);
    }
    expect((await fetch(`${base}/healthz`)).status).to.equal(200);
    expect((await fetch(`${base}/livez`)).status).to.equal(200);
  });

  it("refuses a NUL in an argument or env value with 400 on the legacy PUT /job and a Reject on the broker JOB, in the words Submit uses", async function () {
    this.timeout(30_000);
    exec = await spawnExecserver({ waitgroups, services: { ...services, envy: { waitgroup: "w", command: ["env"], env: ["FOO"] } }, legacy: { enabled: true } });
    const base = `http://${exec.adminAddress}`;
    const cases: [string, object, string][] = [
      ["echo", { args: ["ok", "a\u0000b"] }, "args[1]: must not contain a NUL character"],
      ["envy", { env: { FOO: "x\u0000" } }, "env.FOO: must not contain a NUL character"],
    ];
    for (const [service, job, words] of cases) {
      const { token } = (await (await fetch(`${base}/token/${service}`)).json()) as { token: string };
      const res = await fetch(`${base}/job?token=${token}&job=${encodeURIComponent(JSON.stringify(job))}`, { method: "PUT" });
      expect([res.status, await res.json()], service).to.deep.equal([400, { error: `job: ${words}`, reason: "bad-request" }]);
    }
    // The refused tokens gave their slot back: the one slot is free for a job.
    const { token } = (await (await fetch(`${base}/token/echo`)).json()) as { token: string };
    const ran = await fetch(`${base}/job?token=${token}&job=${encodeURIComponent(JSON.stringify({ args: ["fine"] }))}`, { method: "PUT" });
    expect([ran.status, await ran.text()]).to.deep.equal([200, "fine\n"]);
    // The broker path: the JOB is rejected and its offer withdrawn; nothing runs.
    const stream = await BrokerStream.open(exec.grpcAddress);
    try {
      stream.want("nul", "echo");
      stream.job("nul", (await stream.next("offer")).offerToken, { args: ["ok", "a\u0000b"] });
      const reject = await stream.next("reject");
      expect([reject.jobId, reject.code, reject.message]).to.deep.equal(["nul", RejectCode.INVALID_ARGUMENT, `spec.${cases[0]![2]}; the offer is withdrawn`]);
      await stream.ping();
      expect(stream.unconsumed("done")).to.deep.equal([]);
    } finally {
      await releaseAll();
    }
  });

  it("finding 5: slow-header connections are closed after adminHttp.headersTimeout, and the count is capped", async function () {
    this.timeout(30_000);
    exec = await spawnExecserver({ waitgroups, services, adminHttp: { headersTimeout: "1s", idleTimeout: "1s", maxConnections: 10 } });
    const [host, port] = exec.adminAddress.split(":") as [string, string];
    const open = (): Promise<Socket> =>
      new Promise((resolve, reject) => {
        const s = connect(Number(port), host, () => resolve(s));
        s.once("error", reject);
        sockets.push(s);
      });
    const slow = await Promise.all(Array.from({ length: 15 }, open));
    const closed = new Set<Socket>();
    for (const s of slow) s.once("close", () => closed.add(s));
    // Over the cap: closed at once.
    await waitFor("the 5 connections over the cap to close", () => closed.size >= 5, 3_000, 25);
    expect(closed.size).to.equal(5);
    const header = "GET /healthz HTTP/1.1\r\nhost: x\r\nx-slow: ";
    let i = 0;
    const drip = setInterval(() => {
      for (const s of slow) if (!s.destroyed) s.write(header[i % header.length]!);
      i++;
    }, 200);
    try {
      await waitFor("every slow-header connection to close", () => closed.size === slow.length, 5_000, 50);
    } finally {
      clearInterval(drip);
    }
    expect((await fetch(`http://${exec.adminAddress}/healthz`)).status).to.equal(200);
  });
});
