// Fuzzing a real fylr process: random JSON into every QueueService method, mutated HTTP
// requests into the pipe routes, and a scripted fake execserver that answers its JOBs with
// mutated frames, impossible receipts and hostile uploads to its pipe URLs. The fylr must
// stay up, keep serving other connections, and strand nothing: once the fake behaves,
// every item ends final (or stays claimable).
import { connect } from "node:net";
import { create, toBinary } from "@bufbuild/protobuf";
import { expect } from "chai";
import type pg from "pg";
import { ConnectResponseSchema, type Job } from "../../gen/slotbroker/v1/broker_pb.js";
import { durationFromMs } from "@bufbuild/protobuf/wkt";
import { createTestDatabase } from "../support/postgres.js";
import { waitFor } from "../../harness/execserver-process.js";
import { release, track } from "../../harness/resources.js";
import { closeAll, fastFylrConfig, openPool, spawnFylr, type FylrProcess } from "../integration/support.js";
import { FakeExecserver, type JobHandler } from "./fake-execserver.js";
import { Fuzz, withSeed } from "./fuzz.js";

const QUEUE_REQUESTS = 200;
const PIPE_REQUESTS = 150;
const ITEMS = 30;
const methods = ["Submit", "Get", "Position", "Stats", "Watch"];
const validSubmit = { calls: [{ service: "fz", args: ["x"], env: {}, timeout: "5s" }], priority: 1, maxAttempts: 2, idempotencyKey: "k" };

describe("fuzz: a real fylr", function () {
  this.timeout(60_000);
  let fake: FakeExecserver;
  let fylr: FylrProcess;
  let pool: pg.Pool;
  const alive = (): void => {
    expect(fylr.child.exitCode, `fylr exited:\n${fylr.stderr().slice(-3000)}`).to.equal(null);
  };
  const healthy = async (): Promise<void> => {
    alive();
    const res = await fetch(`${fylr.url}/healthz`, { signal: AbortSignal.timeout(5_000) });
    await res.body?.cancel();
    expect(res.status, "healthz while fuzzing").to.equal(200);
  };

  before(async () => {
    const url = await createTestDatabase("fuzz");
    fake = track(await FakeExecserver.start({ onJob: behave }), "fake execserver", (f) => f.close());
    fylr = await spawnFylr(fastFylrConfig(url, [fake.address], {
        dispatcher: { retryInitial: "50ms", retryMax: "200ms" },
        execserver: { addresses: [fake.address], pingInterval: "1s", pingTimeout: "2s" },
      }), "fuzz-fylr");
    pool = openPool(url, 2);
  });
  after(async () => {
    await closeAll(fylr, pool);
    await release(fake);
  });

  it("answers random JSON to every QueueService method without a 5xx, and stays up", async () => {
    const fuzz = Fuzz.fromEnv();
    await withSeed(fuzz, async () => {
      const serverErrors: string[] = [];
      for (let i = 0; i < QUEUE_REQUESTS; i++) {
        const method = fuzz.pick(methods);
        const r = fuzz.rand();
        const body = r < 0.4 ? JSON.stringify(fuzz.json(4)) : r < 0.9 ? JSON.stringify(fuzz.mutateJson(validSubmit)) : fuzz.mutate(Buffer.from(JSON.stringify(validSubmit))).toString("latin1");
        const contentType = fuzz.rand() < 0.9 ? "application/json" : fuzz.pick(["text/plain", "application/connect+json", "application/proto", ""]);
        try {
          const res = await fetch(`${fylr.url}/slotbroker.v1.QueueService/${method}`, {
            method: "POST",
            headers: contentType ? { "content-type": contentType } : {},
            body,
            signal: AbortSignal.timeout(5_000),
          });
          const text = await res.text();
          if (res.status >= 500) serverErrors.push(`${method} ${res.status} ${text.slice(0, 200)} ← ${body.slice(0, 200)}`);
        } catch (err) {
          serverErrors.push(`${method}: ${(err as Error).message} ← ${body.slice(0, 200)}`);
        }
        if (i % 50 === 0) await healthy();
      }
      await healthy();
      expect(serverErrors, serverErrors.slice(0, 5).join("\n")).to.deep.equal([]);
    });
  });

  it("survives mutated requests to the pipe routes, live pipes included", async () => {
    const fuzz = Fuzz.fromEnv();
    await withSeed(fuzz, async () => {
      const port = Number(new URL(fylr.url).port);
      // Live pipe ids come from the jobs the fake execserver received.
      const livePaths = (): string[] => [...fake.jobs.values()].flatMap((j) => [j.spec?.stdinUrl, j.spec?.stdoutUrl]).filter((u): u is string => !!u).map((u) => new URL(u).pathname);
      for (let i = 0; i < PIPE_REQUESTS; i += 10) {
        const live = livePaths();
        const requests = Array.from({ length: 10 }, () => {
          const path = live.length > 0 && fuzz.rand() < 0.5 ? fuzz.pick(live) : `/pipe/${fuzz.pick(["in", "out", "x", ""])}/${fuzz.pick(["", "abc", fuzz.bytes(16).toString("hex"), "..%2f..", "%00"])}`;
          return { bytes: hostileRequest(fuzz, path), closeAfterMs: fuzz.rand() < 0.3 ? fuzz.int(50) : 500 };
        });
        await Promise.all(requests.map((r) => rawHttp(port, r.bytes, r.closeAfterMs)));
        if (i % 50 === 0) await healthy();
      }
      await healthy();
    });
  });

  it("survives a fake execserver's mutated frames, impossible receipts and hostile uploads; strands no item", async () => {
    const fuzz = Fuzz.fromEnv();
    await withSeed(fuzz, async () => {
      fake.setJobHandler((job, stream) => misbehave(fuzz, job, stream));
      const ids: string[] = [];
      for (let i = 0; i < ITEMS; i++) {
        // Submit refuses a service no connected execserver offers: wait out a reconnect.
        const res = await waitFor("a submit the fylr accepts", async () => {
          const r = await fetch(`${fylr.url}/slotbroker.v1.QueueService/Submit`, {
            method: "POST",
            headers: { "content-type": "application/json" },
            body: JSON.stringify({ calls: [{ service: "fz", args: [String(i)] }], maxAttempts: 3 }),
          });
          if (r.status === 200) return r;
          const text = await r.text();
          if (!text.includes("no connected execserver")) expect.fail(`submit: ${r.status} ${text}`);
          return undefined;
        }, 10_000, 100).catch((err: Error) => {
          throw new Error(`${err.message}; streams open at the fake: ${fake.streams}\nfylr log:\n${fylr.stderr().slice(-3000)}`);
        });
        ids.push(((await res.json()) as { item: { id: string } }).item.id);
      }
      let lastDrop = Date.now();
      await waitFor("most items tried at least once", async () => {
        // Like a flaky network: streams drop now and then, so jobs the fake ignored come back.
        if (Date.now() - lastDrop > 3_000) {
          lastDrop = Date.now();
          fake.dropStreams();
        }
        const { rows } = await pool.query<{ n: number }>("SELECT count(*)::int AS n FROM queue_items WHERE id = ANY($1) AND attempts > 0", [ids]);
        return rows[0]!.n >= ITEMS * 0.7;
      }, 30_000, 100).catch(async (err: Error) => {
        alive();
        const { rows } = await pool.query("SELECT state, attempts, count(*)::int AS n FROM queue_items WHERE id = ANY($1) GROUP BY 1, 2", [ids]);
        throw new Error(`${err.message}; items: ${JSON.stringify(rows)}; jobs the fake got: ${fake.jobs.size}\nfylr log:\n${fylr.stderr().slice(-4000)}`);
      });
      await healthy();
      // From now on the fake behaves; streams holding jobs it ignored are dropped, so the
      // fylr must notice and retry them.
      fake.setJobHandler(behave);
      fake.dropStreams();
      const open = async (): Promise<{ id: string; state: string; attempts: number; error: string | null }[]> =>
        (await pool.query<{ id: string; state: string; attempts: number; error: string | null }>("SELECT id, state, attempts, error FROM queue_items WHERE id = ANY($1) AND state NOT IN ('succeeded', 'failed')", [ids])).rows;
      await waitFor("every item final", async () => {
        alive();
        return (await open()).length === 0;
      }, 30_000, 200).catch(async (err: Error) => {
        alive();
        const stuck = await open();
        const lines = fylr.stderr().split("\n").filter((l) => stuck.some((i) => l.includes(i.id)));
        throw new Error(`${err.message}; still open: ${JSON.stringify(stuck)}; what the fake did per job: ${JSON.stringify(Object.fromEntries(scenarios))}\nfylr log about them:\n${lines.join("\n").slice(-6000)}`);
      });
      await healthy();
    });
  });
});

// A well-behaved execserver's answer: exit 0, a small stdout in the receipt.
const behave: JobHandler = (job, stream) => {
  stream.send({ case: "done", value: { jobId: job.jobId, receipt: { exitCode: 0, stdoutPrefix: Buffer.from("ok"), stdoutBytes: 2n, instanceId: "fake-exec", duration: durationFromMs(1) } } });
};

/** Job id → which misbehaviour the fake chose, for failure messages. */
const scenarios = new Map<string, number>();

async function misbehave(fuzz: Fuzz, job: Job, stream: Parameters<JobHandler>[1]): Promise<void> {
  const out = job.spec?.stdoutUrl ? new URL(job.spec.stdoutUrl) : undefined;
  const inUrl = job.spec?.stdinUrl ? new URL(job.spec.stdinUrl) : undefined;
  const done = (receipt: object): void => stream.send({ case: "done", value: { jobId: job.jobId, receipt: { instanceId: "fake-exec", ...receipt } } });
  const validDone = toBinary(ConnectResponseSchema, create(ConnectResponseSchema, { frame: { case: "done", value: { jobId: job.jobId, receipt: { exitCode: 0, stdoutPrefix: Buffer.from("ok"), stdoutBytes: 2n } } } }));
  const scenario = fuzz.int(10);
  scenarios.set(job.jobId, scenario);
  switch (scenario) {
    case 0:
      return behave(job, stream);
    case 1:
      return done({ exitCode: 3, stderrLine: fuzz.string() });
    case 2: // the receipt says stdout was streamed, but nothing was uploaded
      return done({ exitCode: fuzz.pick([0, 3]), stdoutStreamed: true, stdoutBytes: BigInt(fuzz.int(1e6)), stdoutPrefix: fuzz.bytes(4000) });
    case 3: // a chunked upload cut off mid-body, then a failure
      if (out) await rawHttp(Number(out.port), Buffer.concat([Buffer.from(`PUT ${out.pathname} HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n1000\r\n`), Buffer.alloc(4096), Buffer.from("\r\n1000\r\n"), Buffer.alloc(100)]), 20);
      return done({ exitCode: 3, stdoutStreamed: true, stdoutBytes: 8192n });
    case 4:
      return stream.write(fuzz.mutate(validDone));
    case 5: {
      const frames = [
        { case: "offer" as const, value: { jobId: fuzz.string(), offerToken: "x", expiresIn: durationFromMs(fuzz.int(10_000)) } },
        { case: "done" as const, value: { jobId: fuzz.pick([fuzz.string(), job.jobId]), receipt: { exitCode: fuzz.int(300) - 10, stdoutBytes: 2n ** 63n } } },
        { case: "reject" as const, value: { jobId: job.jobId, code: fuzz.int(12), message: fuzz.string() } },
        { case: "position" as const, value: { jobId: job.jobId, running: fuzz.int(2 ** 31), ahead: 2 ** 32 - 1, state: fuzz.int(9) } },
        { case: "offerExpired" as const, value: { jobId: job.jobId, offerToken: "?" } },
        { case: "hello" as const, value: { instanceId: fuzz.string(), clients: 0, waitgroups: [] } },
      ];
      for (let i = 0; i < 3; i++) stream.send(fuzz.pick(frames));
      return;
    }
    case 6:
      return stream.fail();
    case 7: // no answer; the stream drops a little later
      await new Promise((resolve) => setTimeout(resolve, 500 + fuzz.int(1000)));
      return stream.fail();
    case 8: // stdin read twice, wrong methods, then an upload with a lying length
      if (inUrl) {
        for (const m of ["GET", "GET", "DELETE", "POST"]) await rawHttp(Number(inUrl.port), Buffer.from(`${m} ${inUrl.pathname} HTTP/1.1\r\nhost: x\r\n\r\n`), 300);
      }
      if (out) await rawHttp(Number(out.port), Buffer.from(`PUT ${out.pathname} HTTP/1.1\r\nhost: x\r\ncontent-length: 100000\r\n\r\nshort`), 50);
      return done({ exitCode: 0, stdoutStreamed: true, stdoutBytes: 100000n });
    default: // two uploads at once to one out-pipe
      if (out) {
        const put = (): Promise<void> => rawHttp(Number(out.port), Buffer.from(`PUT ${out.pathname} HTTP/1.1\r\nhost: x\r\ncontent-length: 5000\r\n\r\n${"y".repeat(5000)}`), 1_000);
        await Promise.all([put(), put()]);
      }
      return done({ exitCode: 0, stdoutStreamed: true, stdoutBytes: 5000n, stdoutPrefix: Buffer.alloc(4000, "y") });
  }
}

function hostileRequest(fuzz: Fuzz, path: string): Buffer {
  const method = fuzz.pick(["GET", "PUT", "POST", "DELETE", "PATCH", "HEAD", "OPTIONS", "GARBAGE"]);
  const headers = [`host: 127.0.0.1`];
  const body = fuzz.bytes(fuzz.pick([0, 10, 4096, 5000]));
  switch (fuzz.int(5)) {
    case 0:
      headers.push(`content-length: ${body.length}`);
      break;
    case 1:
      headers.push(`content-length: ${fuzz.pick([body.length + 100, 0, -1, 1e12])}`);
      break;
    case 2:
      headers.push("transfer-encoding: chunked");
      return Buffer.concat([Buffer.from(`${method} ${path} HTTP/1.1\r\n${headers.join("\r\n")}\r\n\r\n${body.length.toString(16)}\r\n`), body.subarray(0, fuzz.int(body.length + 1))]);
    case 3:
      headers.push(`content-type: ${fuzz.string().replace(/[\r\n]/g, "")}`, `content-length: ${body.length}`);
      break;
    default:
      return fuzz.mutate(Buffer.concat([Buffer.from(`${method} ${path} HTTP/1.1\r\n${headers.join("\r\n")}\r\ncontent-length: ${body.length}\r\n\r\n`), body]));
  }
  return Buffer.concat([Buffer.from(`${method} ${path} HTTP/1.1\r\n${headers.join("\r\n")}\r\n\r\n`), body]);
}

/** Sends raw bytes to 127.0.0.1:port and closes the socket after `closeAfterMs` (or when the server does). */
function rawHttp(port: number, bytes: Buffer, closeAfterMs: number): Promise<void> {
  return new Promise((resolve) => {
    const socket = connect(port, "127.0.0.1");
    const finish = (): void => {
      clearTimeout(timer);
      socket.destroy();
      resolve();
    };
    const timer = setTimeout(finish, closeAfterMs);
    socket.on("error", finish);
    socket.on("close", finish);
    socket.on("data", () => undefined);
    socket.write(bytes, () => undefined);
  });
}
