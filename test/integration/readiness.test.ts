// A fylr's readiness (/readyz) against real processes: a `slotbroker fylr` child, a real
// execserver that dies and comes back, a real PostgreSQL that stops taking writes.
// /livez and /healthz stay 200 throughout: readiness takes the fylr out of rotation, it
// never gets it restarted.
import { expect } from "chai";
import type pg from "pg";
import { spawnExecserver, waitFor, type ExecserverProcess } from "../../harness/execserver-process.js";
import { createTestDatabase } from "../support/postgres.js";
import { release } from "../../harness/resources.js";
import { fastFylrConfig, openPool, spawnFylr, type FylrProcess } from "./support.js";

async function readyz(fylr: FylrProcess, query = ""): Promise<{ status: number; body: string }> {
  const res = await fetch(`${fylr.url}/readyz${query}`);
  return { status: res.status, body: await res.text() };
}

/** Waits until /readyz answers `status` with a body matching `body`; returns that body. */
function readiness(fylr: FylrProcess, status: number, body: RegExp): Promise<string> {
  return waitFor(`/readyz ${status} ${body}`, async () => {
    const r = await readyz(fylr);
    if (r.status === status && body.test(r.body)) return r.body;
    throw new Error(`answered ${r.status}: ${r.body}`);
  }, 30_000);
}

async function alive(fylr: FylrProcess): Promise<number[]> {
  return [(await fetch(`${fylr.url}/livez`)).status, (await fetch(`${fylr.url}/healthz`)).status];
}

describe("fylr readiness (/readyz)", function () {
  this.timeout(120_000);
  let exec: ExecserverProcess;
  let databaseUrl: string;
  let admin: pg.Pool;
  let fylr: FylrProcess;

  before(async () => {
    databaseUrl = await createTestDatabase("ready");
  });
  beforeEach(async () => {
    exec = await spawnExecserver({ waitgroups: { text: { processes: 1 } }, services: { wc: { waitgroup: "text", command: ["wc"] } } });
    fylr = await spawnFylr(fastFylrConfig(databaseUrl, [exec.grpcAddress]), "ready");
    const url = new URL(databaseUrl);
    url.pathname = "/postgres";
    admin = openPool(url.href, 1);
  });
  afterEach(async () => {
    await admin.query(`ALTER DATABASE "${new URL(databaseUrl).pathname.slice(1)}" SET default_transaction_read_only = off`);
    await release(fylr);
    await release(exec);
    await release(admin);
  });

  it("is ready once an execserver is connected, not ready while none is, and ready again when it is back", async () => {
    const ready = await readiness(fylr, 200, /^ready\n/);
    expect(ready).to.match(/\[\+\]execservers ok: 1 execserver instance\(s\) connected\n/).and.to.match(/\[\+\]database ok: heartbeat written/);
    await exec.kill("SIGKILL");
    const down = await readiness(fylr, 503, /^not ready: execservers\n/);
    expect(down).to.contain(`[-]execservers failed: no execserver connected (${exec.grpcAddress}: `);
    expect(await alive(fylr), "/livez and /healthz").to.deep.equal([200, 200]);
    // Left out on request (kube-apiserver's convention), the other checks decide.
    expect((await readyz(fylr, "?exclude=execservers")).status).to.equal(200);
    expect(await readyz(fylr, "?exclude=disk")).to.deep.include({ status: 400 });
    await exec.restart();
    await readiness(fylr, 200, /^ready\n/);
  });

  it("is not ready while the database refuses writes, names the reason, and is ready again once it takes them", async () => {
    await readiness(fylr, 200, /^ready\n/);
    const name = new URL(databaseUrl).pathname.slice(1);
    // New sessions of the database are read-only; the fylr's open ones are ended, so its
    // heartbeat reconnects into one.
    const terminate = `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid()`;
    await admin.query(`ALTER DATABASE "${name}" SET default_transaction_read_only = on`);
    await admin.query(terminate, [name]);
    // (The first failure may be the ended session itself; the read-only refusal follows.)
    const refused = await readiness(fylr, 503, /\[-\]database failed: the last \d+ heartbeat write\(s\) failed .*read-only transaction/);
    expect(refused).to.match(/^not ready: database\n/);
    expect(refused).to.match(/\[\+\]execservers ok/);
    expect(await alive(fylr), "/livez and /healthz").to.deep.equal([200, 200]);
    expect(fylr.child.exitCode).to.equal(null);

    await admin.query(`ALTER DATABASE "${name}" SET default_transaction_read_only = off`);
    await admin.query(terminate, [name]);
    await readiness(fylr, 200, /^ready\n/);
  });
});
