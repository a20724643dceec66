import { expect } from "chai";
import { spawn } from "node:child_process";
import { createHash } from "node:crypto";
import http from "node:http";
import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { compileExecserverConfig, type ExecserverConfigInput } from "../../src/execserver/index.js";
import { decodeReceiptHeader, RECEIPT_HEADER } from "../../src/shared/legacy-protocol.js";
import { ConfigError } from "../../src/shared/errors.js";
import { metricFamilies, metricNameProblems, ownFamilies } from "../support/metric-names.js";
import { BrokerStream, eventually, releaseAll } from "./support/broker-stream.js";
import { startTestServer } from "./support/server.js";

// The token protocol from the outside: raw node:http requests and curl against a real
// execserver on loopback.

interface RawResponse {
  readonly status: number;
  readonly headers: http.IncomingHttpHeaders;
  readonly trailers: NodeJS.Dict<string>;
  readonly body: Buffer;
  /** True when the body broke off (no final chunk). */
  readonly aborted: boolean;
}

function request(method: string, url: string, body?: Buffer | string, headers: http.OutgoingHttpHeaders = {}): Promise<RawResponse> {
  return new Promise((resolve, reject) => {
    const req = http.request(url, { method, headers, agent: false }, (res) => {
      const chunks: Buffer[] = [];
      res.on("data", (c: Buffer) => chunks.push(c));
      res.on("error", () => undefined);
      res.on("close", () =>
        resolve({
          status: res.statusCode!,
          headers: res.headers,
          trailers: res.trailers,
          body: Buffer.concat(chunks),
          aborted: !res.complete,
        }),
      );
    });
    req.on("error", reject);
    req.end(body);
  });
}

async function token(base: string, service: string, headers: http.OutgoingHttpHeaders = {}): Promise<string> {
  const res = await request("GET", `${base}/token/${service}`, undefined, headers);
  expect(res.status, res.body.toString()).to.equal(200);
  return (JSON.parse(res.body.toString()) as { token: string }).token;
}

function put(base: string, tok: string, job: object | undefined, body: Buffer | string = "", headers: http.OutgoingHttpHeaders = {}): Promise<RawResponse> {
  const query = new URLSearchParams({ token: tok, ...(job ? { job: JSON.stringify(job) } : {}) });
  return request("PUT", `${base}/job?${query.toString()}`, body, headers);
}

function receiptOf(res: RawResponse): ReturnType<typeof decodeReceiptHeader> {
  const value = (res.headers[RECEIPT_HEADER] as string | undefined) ?? res.trailers[RECEIPT_HEADER];
  expect(value, "receipt header or trailer").to.be.a("string");
  return decodeReceiptHeader(value!);
}

const layout: Partial<ExecserverConfigInput> = {
  waitgroups: { one: { processes: 1 }, slow: { processes: 1 } },
  services: {
    noop: { waitgroup: "one", builtin: "noop" },
    cat: { waitgroup: "one", command: ["cat"] },
    sh: { waitgroup: "one", command: ["sh", "-c"] },
    sleep: { waitgroup: "slow", command: ["sleep"], timeout: "1m" },
  },
};

describe("legacy token protocol (execserver)", () => {
  afterEach(releaseAll);

  it("is off unless the config turns it on", async () => {
    const server = await startTestServer(layout);
    expect(server.legacyUrl).to.equal(undefined);
    expect((await request("GET", `${server.adminUrl}/token/noop`)).status).to.equal(404);
    expect(server.status().legacy).to.equal(undefined);
  });

  it("answers GET /token with a token, 503 while busy and 404 for an unknown service", async () => {
    const server = await startTestServer({ ...layout, legacy: { enabled: true } });
    expect(server.legacyUrl).to.equal(server.adminUrl);
    const first = await request("GET", `${server.legacyUrl}/token/noop`);
    expect(first.status).to.equal(200);
    expect(JSON.parse(first.body.toString())).to.include({ service: "noop", waitgroup: "one", instanceId: "test-exec", expiresInMs: 10_000 });
    const busy = await request("GET", `${server.legacyUrl}/token/cat`);
    expect(busy.status).to.equal(503);
    expect(busy.headers["retry-after"]).to.equal("1");
    expect(JSON.parse(busy.body.toString())).to.deep.equal({ error: "no free slot in waitgroup one (1 slots)", reason: "no-slot" });
    const unknown = await request("GET", `${server.legacyUrl}/token/ffmpeg`);
    expect(unknown.status).to.equal(404);
    expect(JSON.parse(unknown.body.toString())).to.include({ reason: "unknown-service" });
    expect(server.status().waitgroups[0]).to.include({ offered: 1, legacyTokens: 1, free: 0 });
  });

  it("runs a job: stdin from the request body, stdout as the response body, the receipt in a header", async () => {
    const server = await startTestServer({ ...layout, legacy: { enabled: true } });
    const res = await put(server.legacyUrl!, await token(server.legacyUrl!, "cat"), { args: [] }, "hello legacy\n");
    expect(res.status).to.equal(200);
    expect(res.body.toString()).to.equal("hello legacy\n");
    expect(res.headers["content-length"]).to.equal("13");
    const receipt = receiptOf(res);
    expect(receipt).to.include({ exitCode: 0, stdoutBytes: 13n, stdoutStreamed: false, instanceId: "test-exec" });
    expect(receipt.stdoutPrefix.byteLength).to.equal(0);
    await eventually(() => expect(server.status().legacy).to.include({ jobsDone: 1n, tokensRedeemed: 1n, jobsRunning: 0 }));
  });

  it("streams output past 4000 bytes (chunked) and sends the receipt as a trailer after a clean exit", async () => {
    const server = await startTestServer({ ...layout, legacy: { enabled: true } });
    const input = Buffer.alloc(300_000, "x");
    const res = await put(server.legacyUrl!, await token(server.legacyUrl!, "cat"), undefined, input);
    expect(res.aborted).to.equal(false);
    expect(res.headers["transfer-encoding"]).to.equal("chunked");
    expect(res.headers[RECEIPT_HEADER]).to.equal(undefined);
    expect(res.body.equals(input)).to.equal(true);
    expect(receiptOf(res)).to.include({ exitCode: 0, stdoutBytes: 300_000n, stdoutStreamed: true });
  });

  it("answers a command that fails with small output with its receipt, never an empty success", async () => {
    const server = await startTestServer({ ...layout, legacy: { enabled: true } });
    const res = await put(server.legacyUrl!, await token(server.legacyUrl!, "sh"), { args: ["echo partial; echo 'disk full' >&2; exit 3"] });
    expect(res.status).to.equal(200);
    expect(res.body.toString()).to.equal("partial\n");
    expect(receiptOf(res)).to.include({ exitCode: 3, stderrLine: "disk full", stdoutStreamed: false });
  });

  it("breaks the response off when the job fails after its output passed 4000 bytes", async () => {
    const server = await startTestServer({ ...layout, legacy: { enabled: true } });
    const res = await put(server.legacyUrl!, await token(server.legacyUrl!, "sh"), { args: ["head -c 9000 /dev/zero; exit 4"] });
    expect(res.status).to.equal(200);
    expect(res.aborted).to.equal(true);
    expect(res.trailers[RECEIPT_HEADER]).to.equal(undefined);
    // The slot is back for the next job.
    await eventually(() => expect(server.status().waitgroups[0]).to.include({ running: 0, free: 1 }));
  });

  it("says 'token not found' for a token used twice, never issued here, or released", async () => {
    const server = await startTestServer({ ...layout, legacy: { enabled: true } });
    const base = server.legacyUrl!;
    const tok = await token(base, "noop");
    expect((await put(base, tok, undefined)).status).to.equal(200);
    const again = await put(base, tok, undefined);
    expect(again.status).to.equal(404);
    expect(JSON.parse(again.body.toString())).to.deep.equal({
      error: "token not found (expired, used, or issued by another instance)",
      reason: "token-not-found",
    });
    expect((await put(base, "forged-token", undefined)).status).to.equal(404);
    const unused = await token(base, "noop");
    expect((await request("DELETE", `${base}/job?token=${unused}`)).status).to.equal(204);
    expect((await put(base, unused, undefined)).status).to.equal(404);
    expect(server.status().legacy).to.include({ tokensNotFound: 3n, tokensReleased: 1n, jobsDone: 1n });
  });

  it("expires an unredeemed token after tokenTtl and gives its slot to a parked broker want", async () => {
    const server = await startTestServer({ ...layout, legacy: { enabled: true, tokenTtl: "300ms" } });
    const tok = await token(server.legacyUrl!, "noop");
    const stream = await BrokerStream.open(server.grpcAddress);
    stream.want("w1", "noop");
    const offer = await stream.next("offer");
    expect(offer.jobId).to.equal("w1");
    expect((await put(server.legacyUrl!, tok, undefined)).status).to.equal(404);
    expect(server.status().legacy).to.include({ tokensExpired: 1n });
  });

  it("refuses GET /token with 'wants-parked' while a broker want of the waitgroup is parked", async () => {
    const server = await startTestServer({ ...layout, legacy: { enabled: true } });
    const stream = await BrokerStream.open(server.grpcAddress);
    stream.want("running", "sleep");
    const offer = await stream.next("offer");
    stream.job("running", offer.offerToken, { args: ["30"] });
    stream.want("parked", "sleep");
    await eventually(() => expect(server.status().waitgroups[1]).to.include({ running: 1, waiting: 1n }));
    const refused = await request("GET", `${server.legacyUrl}/token/sleep`);
    expect(refused.status).to.equal(503);
    expect(JSON.parse(refused.body.toString())).to.include({ reason: "wants-parked" });
    // Another waitgroup is not held back.
    expect((await request("GET", `${server.legacyUrl}/token/noop`)).status).to.equal(200);
  });

  it("refuses a bad job with 400 naming the field and gives the slot back", async () => {
    const server = await startTestServer({ ...layout, legacy: { enabled: true } });
    const base = server.legacyUrl!;
    const cases: [object, RegExp][] = [
      [{ argz: [] }, /^job: not a job \(JSON of a JobSpec\): .*argz/],
      [{ env: { SECRET: "x" } }, /^job: env: "SECRET" is not allowed for service cat/],
      [{ stdinUrl: "http://127.0.0.1:1/in" }, /stdinUrl\/stdinInline\/stdoutUrl are not used by the token protocol/],
      [{ stdinInline: "eA==" }, /stdinUrl\/stdinInline\/stdoutUrl are not used by the token protocol/],
    ];
    for (const [job, message] of cases) {
      const res = await put(base, await token(base, "cat"), job);
      expect(res.status).to.equal(400);
      expect((JSON.parse(res.body.toString()) as { error: string }).error).to.match(message);
    }
    const raw = await request("PUT", `${base}/job?token=${await token(base, "cat")}&job=%7Bnot-json`);
    expect(raw.status).to.equal(400);
    expect(server.status().waitgroups[0]).to.include({ free: 1, offered: 0, running: 0 });
  });

  it("requires the bearer token when the execserver has one", async () => {
    const server = await startTestServer({ ...layout, token: "s3cret", legacy: { enabled: true } });
    const none = await request("GET", `${server.legacyUrl}/token/noop`);
    expect(none.status).to.equal(401);
    expect(none.headers["www-authenticate"]).to.equal("Bearer");
    expect((await request("GET", `${server.legacyUrl}/token/noop`, undefined, { authorization: "Bearer wrong" })).status).to.equal(401);
    const auth = { authorization: "Bearer s3cret" };
    const tok = await token(server.legacyUrl!, "noop", auth);
    expect((await put(server.legacyUrl!, tok, undefined, "", {})).status).to.equal(401);
    expect((await put(server.legacyUrl!, tok, undefined, "", auth)).status).to.equal(200);
  });

  it("kills the job when the client goes away mid-job", async () => {
    const server = await startTestServer({ ...layout, legacy: { enabled: true } });
    const dir = mkdtempSync(join(tmpdir(), "slotbroker-legacy-"));
    try {
      const pidFile = join(dir, "pid");
      const tok = await token(server.legacyUrl!, "sh");
      const query = new URLSearchParams({ token: tok, job: JSON.stringify({ args: [`echo $$ > ${pidFile}; exec sleep 30`] }) });
      const req = http.request(`${server.legacyUrl}/job?${query.toString()}`, { method: "PUT", agent: false });
      req.on("error", () => undefined);
      req.end();
      await eventually(() => expect(existsSync(pidFile) && readFileSync(pidFile, "utf8").trim()).to.match(/^\d+$/));
      const pid = Number(readFileSync(pidFile, "utf8"));
      req.destroy();
      await eventually(() => expect(alive(pid)).to.equal(false), 5000);
      await eventually(() => expect(server.status().waitgroups[0]).to.include({ running: 0, free: 1 }));
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  it("serves curl: a token, then a streamed upload and download with the receipt trailer", async () => {
    const server = await startTestServer({ ...layout, legacy: { enabled: true } });
    const dir = mkdtempSync(join(tmpdir(), "slotbroker-legacy-curl-"));
    try {
      const input = join(dir, "in");
      writeFileSync(input, Buffer.alloc(100_000, "y"));
      const tok = JSON.parse((await curl(["-sf", `${server.legacyUrl}/token/cat`])).stdout) as { token: string };
      const out = join(dir, "out");
      const headers = join(dir, "headers");
      const res = await curl(["-sf", "-T", input, "-D", headers, "-o", out, `${server.legacyUrl}/job?token=${tok.token}`]);
      expect(res.code).to.equal(0);
      expect(readFileSync(out).equals(readFileSync(input))).to.equal(true);
      const trailer = /^slotbroker-receipt: (.*)$/m.exec(readFileSync(headers, "utf8"))?.[1];
      expect(decodeReceiptHeader(trailer!.trim())).to.include({ exitCode: 0, stdoutBytes: 100_000n });
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  it("runs the curl recipe of docs/protocol.md as written", async () => {
    const server = await startTestServer({
      ...layout,
      services: { ...layout.services, sha256sum: { waitgroup: "one", command: ["sha256sum"] } },
      legacy: { enabled: true },
    });
    const doc = readFileSync(new URL("../../docs/protocol.md", import.meta.url), "utf8");
    const start = doc.indexOf("\n## The legacy token protocol");
    const end = doc.indexOf("\n## ", start + 1);
    const section = doc.slice(start, end === -1 ? undefined : end);
    const blocks = [...section.matchAll(/```sh\n([\s\S]*?)```/g)].map((m) => m[1]!);
    expect(blocks).to.have.length(1);
    const dir = mkdtempSync(join(tmpdir(), "slotbroker-legacy-recipe-"));
    try {
      writeFileSync(join(dir, "input.bin"), Buffer.alloc(10_000, "r"));
      // As written: the legacy base URL comes in as $ADMIN (see the top of protocol.md).
      const script = ["set -euo pipefail", blocks[0]!].join("\n");
      expect(script).to.not.match(/:760\d|127\.0\.0\.1/);
      const out = await new Promise<{ code: number | null; stdout: string; stderr: string }>((resolve, reject) => {
        const child = spawn("bash", ["-c", script], { cwd: dir, stdio: ["ignore", "pipe", "pipe"], env: { ...process.env, ADMIN: server.legacyUrl! } });
        let stdout = "";
        let stderr = "";
        child.stdout.setEncoding("utf8").on("data", (t: string) => (stdout += t));
        child.stderr.setEncoding("utf8").on("data", (t: string) => (stderr += t));
        child.on("error", reject);
        child.on("close", (code) => resolve({ code, stdout, stderr }));
      });
      expect(out.code, out.stderr).to.equal(0);
      const digest = createHash("sha256").update(Buffer.alloc(10_000, "r")).digest("hex");
      expect(readFileSync(join(dir, "output.txt"), "utf8")).to.equal(`${digest}  -\n`);
      const receipt = decodeReceiptHeader(out.stdout.trim().replace(/^slotbroker-receipt:\s*/i, ""));
      expect(receipt).to.include({ exitCode: 0, stdoutBytes: 68n, stdoutStreamed: false });
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  it("serves the protocol on a port of its own when legacy.listen names one", async () => {
    const server = await startTestServer({ ...layout, legacy: { enabled: true, listen: "127.0.0.1:0" } });
    expect(server.legacyUrl).to.not.equal(server.adminUrl);
    expect((await request("GET", `${server.legacyUrl}/token/noop`)).status).to.equal(200);
    expect((await request("GET", `${server.adminUrl}/token/noop`)).status).to.equal(404);
  });

  it("legacy-only mode serves the token protocol on `listen` and no BrokerService", async () => {
    const server = await startTestServer({ ...layout, brokerService: false });
    expect(server.grpcAddress).to.equal("");
    expect(server.grpcPort).to.equal(0);
    const res = await put(server.legacyUrl!, await token(server.legacyUrl!, "cat"), undefined, "old\n");
    expect(res.body.toString()).to.equal("old\n");
    const metrics = await (await fetch(`${server.adminUrl}/metrics`)).text();
    expect(metrics).to.match(/slotbroker_legacy_jobs_done_total\{waitgroup="one",instance_id="test-exec"\} 1/);
    expect(metrics).to.match(/slotbroker_legacy_requests_total\{endpoint="token",code="200",instance_id="test-exec"\} 1/);
  });

  it("answers hostile and malformed requests with a precise error and keeps serving", async () => {
    const server = await startTestServer({ ...layout, legacy: { enabled: true } });
    const base = server.legacyUrl!;
    const badEncoding = await request("GET", `${base}/token/%E0%A4%A`);
    expect(badEncoding.status).to.equal(400);
    expect(JSON.parse(badEncoding.body.toString())).to.include({ reason: "bad-request" });
    const long = await request("GET", `${base}/token/${"x".repeat(5000)}`);
    expect(long.status).to.equal(404);
    expect((JSON.parse(long.body.toString()) as { error: string }).error.length).to.be.below(200);
    const post = await request("POST", `${base}/token/noop`);
    expect(post.status).to.equal(405);
    expect(post.headers.allow).to.equal("GET");
    expect((await request("GET", `${base}/job?token=x`)).status).to.equal(405);
    expect(JSON.parse((await request("PUT", `${base}/job`)).body.toString())).to.deep.equal({ error: "token: missing (PUT /job?token=…)", reason: "bad-request" });
    // A request line over the server's header limit is refused by Node itself (431), and
    // nothing was reserved for it.
    const huge = await request("PUT", `${base}/job?token=x&job=${"a".repeat(20_000)}`);
    expect(huge.status).to.equal(431);
    // Many tokens for a job JSON with every kind of junk: each 400, no slot leaks.
    for (const junk of ["[]", "null", '{"args":"x"}', '{"timeout":"-1s"}', '{"args":[1]}']) {
      const res = await request("PUT", `${base}/job?token=${await token(base, "cat")}&job=${encodeURIComponent(junk)}`);
      expect(res.status, junk).to.equal(400);
    }
    expect(server.status().waitgroups[0]).to.include({ free: 1, offered: 0, running: 0 });
    expect((await put(base, await token(base, "cat"), undefined, "still serving\n")).body.toString()).to.equal("still serving\n");
  });

  it("drains: GET /token answers 503 'draining' while a running legacy job is let finish", async () => {
    const server = await startTestServer({ ...layout, legacy: { enabled: true } });
    const base = server.legacyUrl!;
    const running = put(base, await token(base, "sh"), { args: ["sleep 0.5; echo finished"] });
    await eventually(() => expect(server.status().legacy?.jobsRunning).to.equal(1));
    const closing = server.close();
    const refused = await request("GET", `${base}/token/noop`);
    expect(refused.status).to.equal(503);
    expect(JSON.parse(refused.body.toString())).to.include({ reason: "draining" });
    const res = await running;
    expect(res.body.toString()).to.equal("finished\n");
    expect(receiptOf(res)).to.include({ exitCode: 0 });
    await closing;
    expect(server.state).to.equal("stopped");
  });

  it("names its metrics by the Prometheus rules and documents every family in the operator guide", async () => {
    const server = await startTestServer({ ...layout, legacy: { enabled: true } });
    await put(server.legacyUrl!, await token(server.legacyUrl!, "noop"), undefined);
    const families = ownFamilies(metricFamilies(await (await fetch(`${server.adminUrl}/metrics`)).text()));
    expect(families.map((f) => f.name)).to.include.members([
      "slotbroker_legacy_requests_total",
      "slotbroker_legacy_tokens_total",
      "slotbroker_legacy_refused_total",
      "slotbroker_legacy_jobs_done_total",
      "slotbroker_slot_idle_gap_seconds",
      "slotbroker_frames_received_total",
    ]);
    expect(families.flatMap((f) => metricNameProblems(f))).to.deep.equal([]);
    const guide = readFileSync(new URL("../../docs/operator-guide.md", import.meta.url), "utf8");
    expect(families.filter((f) => !guide.includes(`\`${f.name}\``)).map((f) => f.name)).to.deep.equal([]);
  });

  it("rejects contradictory legacy config naming the key", () => {
    const base = { waitgroups: { g: { processes: 1 } }, services: { s: { waitgroup: "g", builtin: "noop" } } };
    const bad: [object, RegExp][] = [
      [{ brokerService: false, legacy: { listen: "127.0.0.1:9" } }, /legacy\.listen: with brokerService: false/],
      [{ legacy: { enabled: true, listen: "127.0.0.1:7600" } }, /legacy\.listen: 127\.0\.0\.1:7600 is already taken by listen/],
      [{ legacy: { enabled: true, listen: "0.0.0.0:7700" } }, /token: required when legacy\.listen \(0\.0\.0\.0:7700\)/],
      [{ adminListen: "0.0.0.0:7601", legacy: { enabled: true } }, /token: required when legacy\.listen: admin/],
      [{ legacy: { enabled: true, tokenTtl: "0s" } }, /legacy\.tokenTtl: must be more than 0/],
      [{ legacy: { enabled: true, ttl: "1s" } }, /unknown key "legacy\.ttl"/],
    ];
    for (const [extra, message] of bad) {
      expect(() => compileExecserverConfig({ ...base, ...extra }, "t")).to.throw(ConfigError, message);
    }
    expect(compileExecserverConfig({ ...base, brokerService: false }, "t").legacy).to.deep.equal({ listen: "listen", tokenTtlMs: 10_000 });
    expect(compileExecserverConfig(base, "t").legacy).to.equal(undefined);
  });
});

function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
}

function curl(args: string[]): Promise<{ code: number | null; stdout: string }> {
  return new Promise((resolve, reject) => {
    const child = spawn("curl", args, { stdio: ["ignore", "pipe", "inherit"] });
    let stdout = "";
    child.stdout.setEncoding("utf8").on("data", (s: string) => (stdout += s));
    child.on("error", reject);
    child.on("close", (code) => resolve({ code, stdout }));
  });
}

