// The fylr's API auth against real processes: a `slotbroker fylr` child with tokens of each
// scope, a real execserver (which fetches pipes with no token at all), and the calls of
// every scope made over Connect (the project's client), gRPC (grpc-js; grpcurl in
// test/ecosystem/polyglot/grpcurl-auth.test.ts) and plain HTTP (curl). Rotation of the tokens file by SIGHUP, and by its poll.
import { expect } from "chai";
import { randomUUID } from "node:crypto";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { create } from "@bufbuild/protobuf";
import { Code, ConnectError } from "@connectrpc/connect";
import * as grpc from "@grpc/grpc-js";
import { ItemState, QueueService, type WatchResponse } from "../../gen/slotbroker/v1/queue_pb.js";
import { createQueueClient, type ApiCredentials, type QueueClient } from "../../src/api/index.js";
import { allows, queueProcedureScopes, type Scope } from "../../src/fylr/index.js";
import { grpcClientConstructor } from "../../src/shared/grpc.js";
import { spawnExecserver, type ExecserverProcess } from "../../harness/execserver-process.js";
import { createTestDatabase } from "../support/postgres.js";
import { requireTool } from "../../harness/system-tools.js";
import { run, type Run } from "../support/run-program.js";
import { closeAll, fastFylrConfig, slotbroker, spawnFylr, startTestFylr, type FylrProcess } from "./support.js";

const tokens = {
  reader: "reader-7f3c9a1b2d4e5f60",
  submitter: "submitter-0a1b2c3d4e5f6071",
  ops: "ops-9e8d7c6b5a49382716",
} as const;
type Who = "nobody" | "stranger" | keyof typeof tokens;
const scopesOf: Record<keyof typeof tokens, Scope[]> = { reader: ["read"], submitter: ["submit"], ops: ["admin"] };
const everyone: Who[] = ["nobody", "stranger", "reader", "submitter", "ops"];

/** What `who` calling something that needs `scope` must get. */
function expected(who: Who, scope: Scope): "allowed" | "unauthenticated" | "permission_denied" {
  if (who === "nobody" || who === "stranger") return "unauthenticated";
  return allows(new Set(scopesOf[who]), scope) ? "allowed" : "permission_denied";
}

function tokenOf(who: Who): string | undefined {
  return who === "nobody" ? undefined : who === "stranger" ? "stranger-token-not-configured" : tokens[who];
}

const methodScope = (method: string): Scope => queueProcedureScopes.get(`/${QueueService.typeName}/${method}`)!;

describe("fylr API auth against a real fylr and execserver", function () {
  this.timeout(120_000);
  let exec: ExecserverProcess;
  let fylr: FylrProcess;
  let dir: string;
  let tokensFile: string;
  let address: string;
  let itemId: string;
  let admin: QueueClient;

  const writeTokens = (name: string, token: string): void =>
    writeFileSync(tokensFile, `tokens:\n  - { name: ${name}, token: ${token}, scopes: [read] }\n`);

  before(async function () {
    this.timeout(180_000);
    dir = mkdtempSync(join(tmpdir(), "slotbroker-auth-"));
    tokensFile = join(dir, "tokens.yaml");
    writeTokens("rotating", "rotating-old-0123456789");
    const databaseUrl = await createTestDatabase("auth");
    exec = await spawnExecserver({
      waitgroups: { text: { processes: 4 } },
      services: { wc: { waitgroup: "text", command: ["wc", "-c"] }, sleep: { waitgroup: "text", command: ["sleep"] } },
    });
    const auth = {
      tokens: Object.entries(tokens).map(([name, token]) => ({ name, token, scopes: scopesOf[name as keyof typeof tokens] })),
      tokensFile,
      reloadInterval: "0s",
    };
    fylr = await spawnFylr(fastFylrConfig(databaseUrl, [exec.grpcAddress], { auth }), "auth", { credentials: { token: tokens.ops }, logLevel: "info" });
    address = fylr.url.replace(/^http:\/\//, "");
    admin = fylr.client;
    const { item } = await admin.submit({ calls: [{ service: "wc", stdin: { case: "stdinData", value: Buffer.from("hello\n") } }] });
    itemId = item!.id;
    for await (const update of admin.watch({ id: itemId })) if (update.item?.state === ItemState.SUCCEEDED) break;
  });

  after(async () => {
    await closeAll(fylr, exec);
    rmSync(dir, { recursive: true, force: true });
  });

  // One call per QueueService method; an allowed call may still fail for its own reasons
  // (an unknown id), never for auth.
  const requests: Record<string, () => Record<string, unknown>> = {
    Submit: () => ({ calls: [{ service: "wc", stdin: { case: "stdinData", value: Buffer.from("x") } }] }),
    Get: () => ({ id: itemId }),
    Watch: () => ({ id: itemId }),
    Position: () => ({ id: itemId }),
    Stats: () => ({}),
    List: () => ({ pageSize: 1 }),
    Cancel: () => ({ id: randomUUID() }),
    Retry: () => ({ id: randomUUID() }),
    Delete: () => ({ id: randomUUID() }),
  };

  function outcome(code: Code | undefined): string {
    return code === Code.Unauthenticated ? "unauthenticated" : code === Code.PermissionDenied ? "permission_denied" : "allowed";
  }

  it("over Connect (the project's client): every method, for every caller, allowed or refused by scope", async () => {
    const problems: string[] = [];
    for (const who of everyone) {
      const token = tokenOf(who);
      const client = createQueueClient(fylr.url, token === undefined ? {} : { token });
      for (const [method, request] of Object.entries(requests)) {
        let code: Code | undefined;
        let message = "";
        try {
          const local = method.charAt(0).toLowerCase() + method.slice(1);
          if (method === "Watch") for await (const _ of client.watch(request()));
          else await (client[local as keyof QueueClient] as (r: unknown) => Promise<unknown>)(request());
        } catch (err) {
          const e = ConnectError.from(err);
          [code, message] = [e.code, e.rawMessage];
        }
        const want = expected(who, methodScope(method));
        if (outcome(code) !== want) problems.push(`${who} ${method}: got ${outcome(code)} (${message}), want ${want}`);
        if (want === "unauthenticated" && !/no credential|unknown token/.test(message)) problems.push(`${who} ${method}: unclear message "${message}"`);
        if (want === "permission_denied" && !new RegExp(`token "${who}" has .*needs the ${methodScope(method)} scope`).test(message)) {
          problems.push(`${who} ${method}: unclear message "${message}"`);
        }
      }
    }
    expect(problems).to.deep.equal([]);
  });

  it("over gRPC (grpc-js): every method, for every caller, with grpc-status 16 or 7 when refused", async () => {
    const Client = grpcClientConstructor(QueueService);
    const client = new Client(address, grpc.credentials.createInsecure()) as unknown as Record<string, (...args: unknown[]) => unknown>;
    const problems: string[] = [];
    try {
      for (const who of everyone) {
        const metadata = new grpc.Metadata();
        const token = tokenOf(who);
        if (token !== undefined) metadata.set("authorization", `Bearer ${token}`);
        for (const [method, request] of Object.entries(requests)) {
          const descriptor = QueueService.methods.find((m) => m.name === method)!;
          const message = create(descriptor.input, request() as never);
          const code = await new Promise<grpc.status>((resolve) => {
            if (method === "Watch") {
              const call = (client.watch as (r: unknown, m: grpc.Metadata) => grpc.ClientReadableStream<unknown>)(message, metadata);
              call.on("data", () => undefined);
              call.on("error", (err: grpc.ServiceError) => resolve(err.code));
              call.on("end", () => resolve(0));
              return;
            }
            (client[descriptor.localName] as (r: unknown, m: grpc.Metadata, cb: (err: grpc.ServiceError | null) => void) => void).call(client, message, metadata, (err) =>
              resolve(err ? err.code : 0),
            );
          });
          const got = code === grpc.status.UNAUTHENTICATED ? "unauthenticated" : code === grpc.status.PERMISSION_DENIED ? "permission_denied" : "allowed";
          const want = expected(who, methodScope(method));
          if (got !== want) problems.push(`${who} ${method}: got ${got} (status ${code}), want ${want}`);
        }
      }
    } finally {
      (client as unknown as grpc.Client).close();
    }
    expect(problems).to.deep.equal([]);
  });

  describe("over plain HTTP (curl)", () => {
    let curl: string;
    before(() => (curl = requireTool("curl")));

    /** Status and headers+body of one curl request. */
    async function call(args: string[], token?: string): Promise<{ status: number; text: string }> {
      const auth = token === undefined ? [] : ["-H", `authorization: Bearer ${token}`];
      const r = await run(curl, ["-s", "-i", "-w", "\n%{http_code}", ...auth, ...args]);
      const at = r.stdout.lastIndexOf("\n");
      return { status: Number(r.stdout.slice(at + 1)), text: r.stdout.slice(0, at) };
    }

    it("Connect JSON calls answer 401 with WWW-Authenticate, 403, or go through", async () => {
      const problems: string[] = [];
      for (const who of everyone) {
        for (const [method, request] of Object.entries(requests)) {
          if (method === "Watch") continue;
          const body = JSON.stringify(method === "Submit" ? { calls: [{ service: "wc", stdinData: "eA==" }] } : request());
          const { status, text } = await call(["-X", "POST", "-H", "Content-Type: application/json", "-d", body, `${fylr.url}/slotbroker.v1.QueueService/${method}`], tokenOf(who));
          const got = status === 401 ? "unauthenticated" : status === 403 ? "permission_denied" : "allowed";
          const want = expected(who, methodScope(method));
          if (got !== want) problems.push(`${who} ${method}: HTTP ${status}, want ${want}`);
          if (status === 401 && !/^www-authenticate: Bearer realm="slotbroker"/im.test(text)) problems.push(`${who} ${method}: 401 without WWW-Authenticate`);
          if (status === 401 && !text.includes('{"code":"unauthenticated","message":')) problems.push(`${who} ${method}: 401 body ${text}`);
        }
      }
      expect(problems).to.deep.equal([]);
    });

    it("a Connect stream (Watch) refused by curl ends with the error in its end-of-stream envelope", async () => {
      // The request is one envelope (flags 0, length 45), as docs/protocol.md sends it.
      const watch = (token?: string): Promise<Run> =>
        run("bash", [
          "-c",
          `printf '\\0\\0\\0\\0\\055{"id":"%s"}' "$ID" | "$CURL" -s ${token ? '-H "authorization: Bearer $TOKEN"' : ""} -X POST ` +
            `-H 'Content-Type: application/connect+json' --data-binary @- "$URL" | tr '\\0' '\\n'`,
        ], { env: { ...process.env, ID: itemId, CURL: curl, TOKEN: token ?? "", URL: `${fylr.url}/slotbroker.v1.QueueService/Watch` } });
      const refused = await watch();
      expect(refused.stdout).to.include('{"error":{"code":"unauthenticated","message":"no credential');
      const denied = await watch(tokens.submitter);
      expect(denied.stdout).to.include('"code":"permission_denied"');
      const allowed = await watch(tokens.reader);
      expect(allowed.stdout).to.include('"state":"ITEM_STATE_SUCCEEDED"');
    });

    it("uploads need submit, output downloads read, /status.json and the status page read; /metrics, /healthz and pipes are open", async () => {
      const upload = (token?: string): Promise<{ status: number; text: string }> =>
        call(["-X", "POST", "-H", "Content-Type: application/octet-stream", "--data-binary", "some input bytes", `${fylr.url}/queue/inputs`], token);
      expect((await upload()).status).to.equal(401);
      expect((await upload(tokens.reader)).status).to.equal(403);
      expect((await upload(tokens.submitter)).status).to.equal(201);
      const output = `${fylr.url}/queue/items/${itemId}/output`;
      expect((await call([output])).status).to.equal(401);
      expect((await call([output], tokens.submitter)).status).to.equal(403);
      const got = await call([output], tokens.reader);
      expect(got.status).to.equal(200);
      expect(got.text.endsWith("\r\n\r\n6\n")).to.equal(true);
      for (const path of ["/status.json", "/status/live.json", "/status/view.json"]) {
        expect((await call([`${fylr.url}${path}`])).status, path).to.equal(401);
        expect((await call([`${fylr.url}${path}`], tokens.submitter)).status, path).to.equal(403);
        expect((await call([`${fylr.url}${path}`], tokens.reader)).status, path).to.equal(200);
      }
      for (const path of ["/metrics", "/healthz", "/livez"]) expect((await call([`${fylr.url}${path}`])).status, path).to.equal(200);
      // Pipes keep their one-time id as the credential: an unknown id is a 404, never a 401.
      expect((await call([`${fylr.url}/pipe/in/no-such-pipe-id-0123456789`])).status).to.equal(404);
    });

    it("the status page asks a browser for Basic auth and takes the token as the password", async () => {
      const browser = ["-H", "Accept: text/html,application/xhtml+xml"];
      const challenged = await call([...browser, `${fylr.url}/`]);
      expect(challenged.status).to.equal(401);
      expect(challenged.text).to.match(/^www-authenticate: Basic realm="slotbroker"/im);
      const page = await call([...browser, "-u", `anyone:${tokens.reader}`, `${fylr.url}/`]);
      expect(page.status).to.equal(200);
      expect(page.text).to.include("<html");
      expect((await call([...browser, "-u", "anyone:wrong-password-0123456789", `${fylr.url}/status`])).status).to.equal(401);
      expect((await call(["-u", `anyone:${tokens.submitter}`, `${fylr.url}/status.json`])).status).to.equal(403);
    });
  });

  it("the CLI sends SLOTBROKER_API_TOKEN or --token-file, and says plainly when it is missing or unknown", async () => {
    const env = { SLOTBROKER_API: fylr.url, SLOTBROKER_API_TOKEN: "" };
    const missing = await slotbroker(["list"], { env });
    expect(missing.code).to.equal(1);
    expect(missing.stderr).to.include("answered 401 unauthenticated: no credential");
    expect(missing.stderr).to.include("no token was given: set SLOTBROKER_API_TOKEN or use --token-file FILE");
    const unknown = await slotbroker(["list"], { env: { ...env, SLOTBROKER_API_TOKEN: "not-a-configured-token" } });
    expect(unknown.stderr).to.include("unknown token");
    expect(unknown.stderr).to.include("the token from SLOTBROKER_API_TOKEN was refused");
    expect(unknown.stderr).to.not.include("not-a-configured-token");
    const listed = await slotbroker(["list"], { env: { ...env, SLOTBROKER_API_TOKEN: tokens.reader } });
    expect(listed.code, listed.stderr).to.equal(0);
    expect(listed.stdout.toString()).to.include(itemId);
    const file = join(dir, "reader.token");
    writeFileSync(file, `${tokens.reader}\n`);
    const denied = await slotbroker(["cancel", itemId, "--token-file", file], { env });
    expect(denied.code).to.equal(1);
    expect(denied.stderr).to.include('answered 403 permission denied: token "reader" has read; this call needs the admin scope');
    const submitted = await slotbroker(["submit", "--service", "wc", "--stdin", "-", "--wait"], { env: { ...env, SLOTBROKER_API_TOKEN: tokens.ops }, input: "abc" });
    expect(submitted.code, submitted.stderr).to.equal(0);
    expect(submitted.stdout.toString()).to.equal("3\n");
  });

  it("SIGHUP rotates the tokens file: the old token is refused, the new one taken, a Watch already open runs on", async () => {
    const old = createQueueClient(fylr.url, { token: "rotating-old-0123456789" });
    const fresh = createQueueClient(fylr.url, { token: "rotating-new-0123456789" });
    const { item } = await admin.submit({ calls: [{ service: "sleep", args: ["60"] }] });
    const updates: WatchResponse[] = [];
    const watching = (async () => {
      for await (const update of old.watch({ id: item!.id })) updates.push(update);
    })();
    await waitFor(() => updates.length > 0, "the first Watch update");
    writeTokens("rotating", "rotating-new-0123456789");
    fylr.child.kill("SIGHUP");
    await waitFor(async () => (await fresh.stats({}).then(() => true, () => false)), "the new token to be accepted");
    const refused = await old.stats({}).then(() => undefined, (err: unknown) => ConnectError.from(err));
    expect(refused?.code).to.equal(Code.Unauthenticated);
    // The Watch that began with the old token follows the item to its end.
    await admin.cancel({ id: item!.id });
    await watching;
    expect(updates.at(-1)?.item?.state).to.equal(ItemState.CANCELLED);
    expect(fylr.stderr()).to.include('"msg":"api tokens loaded"');
  });

  it("refusals are logged with the token's name, never a token", () => {
    const log = fylr.stderr();
    expect(log).to.include('"msg":"api call refused"');
    for (const token of [...Object.values(tokens), "rotating-old-0123456789", "rotating-new-0123456789", "stranger-token-not-configured"]) {
      expect(log, token).to.not.include(token);
    }
  });
});

describe("fylr API auth: the tokens file's poll", function () {
  this.timeout(60_000);
  let dir: string;
  beforeEach(() => (dir = mkdtempSync(join(tmpdir(), "slotbroker-auth-poll-"))));
  afterEach(() => rmSync(dir, { recursive: true, force: true }));

  it("a changed tokens file is in force within reloadInterval, with no signal", async () => {
    const file = join(dir, "tokens.yaml");
    writeFileSync(file, "tokens: [{ name: a, token: poll-token-a-0123456789, scopes: [read] }]\n");
    const fylr = await startTestFylr(
      fastFylrConfig(await createTestDatabase("authpoll"), ["127.0.0.1:1"], { auth: { tokensFile: file, reloadInterval: "100ms" } }),
    );
    const client = (token: string): QueueClient => createQueueClient(fylr.url, { token } satisfies ApiCredentials);
    await client("poll-token-a-0123456789").stats({});
    writeFileSync(file, "tokens: [{ name: b, token: poll-token-b-0123456789, scopes: [read] }]\n");
    await waitFor(async () => (await client("poll-token-b-0123456789").stats({}).then(() => true, () => false)), "token b");
    const refused = await client("poll-token-a-0123456789").stats({}).then(() => undefined, (err: unknown) => ConnectError.from(err));
    expect(refused?.code).to.equal(Code.Unauthenticated);
    await closeAll(fylr);
  });
});

describe("a fylr on a non-loopback address", function () {
  this.timeout(60_000);

  it("refuses to start without credentials: the process exits 1 naming auth", async () => {
    // 192.0.2.1 (TEST-NET-1) is on no interface here: nothing is ever bound, fix or not.
    const dir = mkdtempSync(join(tmpdir(), "slotbroker-auth-listen-"));
    try {
      const config = join(dir, "fylr.yaml");
      writeFileSync(config, "listen: 192.0.2.1:7700\ndatabaseUrl: postgres://u@127.0.0.1:1/x\nexecserver: { addresses: [127.0.0.1:1] }\n");
      const { code, stderr } = await slotbroker(["fylr", "--config", config]);
      expect(code).to.equal(1);
      expect(stderr).to.include(`slotbroker fylr: invalid config: ${config}: auth: required when listen (192.0.2.1:7700) is not a loopback address`);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});

/** Polls `done` until it holds (every 50 ms, up to 20 s). */
async function waitFor(done: () => boolean | Promise<boolean>, what: string): Promise<void> {
  const deadline = Date.now() + 20_000;
  while (!(await done())) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
}
