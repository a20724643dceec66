// Stock tools against real processes, as a new user would poke at them: grpcurl (built by
// scripts/build-go-tools.sh) using server reflection only — no .proto files — against a
// real execserver and a real fylr, and curl running the queue API recipes of
// docs/protocol.md word for word (only the address differs), with the API token the
// recipes read from SLOTBROKER_API_TOKEN.
import { expect } from "chai";
import { createHash } from "node:crypto";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { create, fromBinary } from "@bufbuild/protobuf";
import { FileDescriptorProtoSchema, FileDescriptorSetSchema } from "@bufbuild/protobuf/wkt";
import * as grpc from "@grpc/grpc-js";
import {
  ServerReflection,
  ServerReflectionRequestSchema,
  type ServerReflectionRequest,
  type ServerReflectionResponse,
} from "../../../gen/grpc/reflection/v1/reflection_pb.js";
import { grpcClientConstructor } from "../../../src/shared/grpc.js";
import { spawnExecserver, type ExecserverProcess } from "../../../harness/execserver-process.js";
import { createTestDatabase } from "../../support/postgres.js";
import { closeAll, fastFylrConfig, root, spawnFylr, type FylrProcess } from "../../integration/support.js";
import { goTools, mapLimit, run, symbolsOf, type Run } from "./support.js";

const token = "stock-secret";
const apiToken = "stock-api-token-0123456789";
const execServices = ["grpc.health.v1.Health", "grpc.reflection.v1.ServerReflection", "grpc.reflection.v1alpha.ServerReflection", "slotbroker.v1.BrokerService"];
const fylrServices = [
  "grpc.health.v1.Health",
  "grpc.reflection.v1.ServerReflection",
  "grpc.reflection.v1alpha.ServerReflection",
  "slotbroker.v1.PipeService",
  "slotbroker.v1.QueueService",
];

/** One reflection request over a raw grpc-js client (what grpcurl does not expose). */
async function reflect(address: string, messageRequest: ServerReflectionRequest["messageRequest"]): Promise<ServerReflectionResponse> {
  const Client = grpcClientConstructor(ServerReflection);
  const client = new Client(address, grpc.credentials.createInsecure());
  try {
    const call = (client as unknown as { serverReflectionInfo: () => grpc.ClientDuplexStream<object, ServerReflectionResponse> }).serverReflectionInfo();
    const response = new Promise<ServerReflectionResponse>((resolve, reject) => {
      call.once("data", resolve);
      call.once("error", reject);
    });
    call.write(create(ServerReflectionRequestSchema, { messageRequest }));
    const r = await response;
    call.end();
    return r;
  } finally {
    client.close();
  }
}

describe("stock tools against a real execserver and a real fylr", function () {
  this.timeout(120_000);
  let grpcurl: string;
  let exec: ExecserverProcess;
  let fylr: FylrProcess;
  let fylrAddress: string;

  before(async function () {
    this.timeout(660_000);
    grpcurl = join(await goTools(), "grpcurl");
    const databaseUrl = await createTestDatabase("stock");
    exec = await spawnExecserver({
      instanceId: "stock-exec",
      token,
      waitgroups: { text: { processes: 2 } },
      services: { sha256sum: { waitgroup: "text", command: ["sha256sum"] }, wc: { waitgroup: "text", command: ["wc", "-c"] } },
    });
    fylr = await spawnFylr(
      fastFylrConfig(databaseUrl, [exec.grpcAddress], {
        execserver: { addresses: [exec.grpcAddress], token },
        auth: { tokens: [{ name: "stock", token: apiToken, scopes: ["submit", "read"] }] },
      }),
      "stock",
      { credentials: { token: apiToken } },
    );
    fylrAddress = fylr.url.replace(/^http:\/\//, "");
  });

  after(() => closeAll(fylr, exec));

  const grpcurlRun = (args: string[]): Promise<Run> => run(grpcurl, ["-plaintext", ...args]);

  function expectOk(r: Run, what: string): string {
    expect(r.code, `${what}: ${r.stderr}`).to.equal(0);
    return r.stdout;
  }

  it("grpcurl lists each server's services, health and reflection included", async () => {
    expect(expectOk(await grpcurlRun([exec.grpcAddress, "list"]), "list execserver").trim().split("\n")).to.deep.equal(execServices);
    expect(expectOk(await grpcurlRun([fylrAddress, "list"]), "list fylr").trim().split("\n")).to.deep.equal(fylrServices);
  });

  for (const [who, services] of [
    ["execserver", execServices],
    ["fylr", fylrServices],
  ] as const) {
    it(`grpcurl describes every service, message and enum of the ${who} by reflection alone`, async () => {
      const address = who === "execserver" ? exec.grpcAddress : fylrAddress;
      const symbols = symbolsOf(services);
      expect(symbols.map((s) => s.name)).to.include.members(["slotbroker.v1.Offer", "google.protobuf.Duration", "grpc.health.v1.HealthCheckResponse.ServingStatus"]);
      const failures = (
        await mapLimit(symbols, 4, async (symbol) => {
          const r = await grpcurlRun([address, "describe", symbol.name]);
          const header = {
            message: "is a message:",
            service: "is a service:",
            enum: "is an enum:",
            "map entry": "is the entry type for a map field:",
          }[symbol.kind];
          if (r.code !== 0 || !r.stdout.startsWith(`${symbol.name} ${header}`)) return `${symbol.name}: ${r.stderr || r.stdout.slice(0, 200)}`;
          const missing = symbol.members.filter((m) => !new RegExp(`\\b${m}\\b`).test(r.stdout));
          return missing.length > 0 ? `${symbol.name}: missing ${missing.join(", ")}` : undefined;
        })
      ).filter(Boolean);
      expect(failures).to.deep.equal([]);
    });
  }

  it("grpcurl shows the proto comments and saves broker.proto with its imports", async () => {
    const offer = expectOk(await grpcurlRun([exec.grpcAddress, "describe", "slotbroker.v1.Offer"]), "describe Offer");
    expect(offer).to.include("// How long the offer stays reserved");
    expect(offer).to.include(".google.protobuf.Duration expires_in = 3;");
    const dir = mkdtempSync(join(tmpdir(), "slotbroker-protoset-"));
    try {
      const out = join(dir, "broker.protoset");
      expectOk(await grpcurlRun(["-protoset-out", out, exec.grpcAddress, "describe", "slotbroker.v1.BrokerService"]), "protoset-out");
      const set = fromBinary(FileDescriptorSetSchema, readFileSync(out));
      expect(set.file.map((f) => f.name).sort()).to.deep.equal(["google/protobuf/duration.proto", "google/protobuf/timestamp.proto", "slotbroker/v1/broker.proto"]);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  it("both servers answer file_by_filename google/protobuf/duration.proto with the real file", async () => {
    for (const address of [exec.grpcAddress, fylrAddress]) {
      const r = await reflect(address, { case: "fileByFilename", value: "google/protobuf/duration.proto" });
      expect(r.messageResponse.case, address).to.equal("fileDescriptorResponse");
      const files = r.messageResponse.case === "fileDescriptorResponse" ? r.messageResponse.value.fileDescriptorProto : [];
      const file = fromBinary(FileDescriptorProtoSchema, files[0]!);
      expect(file.name).to.equal("google/protobuf/duration.proto");
      expect(file.messageType.map((m) => m.name)).to.deep.equal(["Duration"]);
      expect(file.options?.goPackage).to.equal("google.golang.org/protobuf/types/known/durationpb");
    }
  });

  it("grpcurl calls GetStatus with the token (and is refused without it) and Health/Check on the execserver", async () => {
    const status = JSON.parse(
      expectOk(await grpcurlRun(["-H", `authorization: Bearer ${token}`, exec.grpcAddress, "slotbroker.v1.BrokerService/GetStatus"]), "GetStatus"),
    ) as { instanceId: string; services: Record<string, string> };
    expect(status.instanceId).to.equal("stock-exec");
    expect(status.services).to.deep.equal({ sha256sum: "text", wc: "text" });
    const refused = await grpcurlRun([exec.grpcAddress, "slotbroker.v1.BrokerService/GetStatus"]);
    expect(refused.code).to.not.equal(0);
    expect(refused.stderr).to.match(/Unauthenticated/);
    for (const service of ["", "slotbroker.v1.BrokerService"]) {
      const health = JSON.parse(expectOk(await grpcurlRun(["-d", JSON.stringify({ service }), exec.grpcAddress, "grpc.health.v1.Health/Check"]), "Check")) as {
        status: string;
      };
      expect(health.status, service).to.equal("SERVING");
    }
  });

  it("grpcurl calls Health/Check (open), and Stats, Submit and Watch with the API token, on the fylr", async () => {
    for (const service of ["", "slotbroker.v1.QueueService", "slotbroker.v1.PipeService"]) {
      const health = JSON.parse(expectOk(await grpcurlRun(["-d", JSON.stringify({ service }), fylrAddress, "grpc.health.v1.Health/Check"]), "Check")) as {
        status: string;
      };
      expect(health.status, service).to.equal("SERVING");
    }
    const refused = await grpcurlRun([fylrAddress, "slotbroker.v1.QueueService/Stats"]);
    expect(refused.code).to.not.equal(0);
    expect(refused.stderr).to.match(/Code: Unauthenticated/);
    const auth = ["-H", `authorization: Bearer ${apiToken}`];
    const stats = JSON.parse(expectOk(await grpcurlRun([...auth, fylrAddress, "slotbroker.v1.QueueService/Stats"]), "Stats")) as { fylrId: string };
    expect(stats.fylrId).to.equal(fylr.id);
    const submitted = JSON.parse(
      expectOk(await grpcurlRun([...auth, "-d", '{"calls":[{"service":"wc","stdinData":"aGVsbG8K"}]}', fylrAddress, "slotbroker.v1.QueueService/Submit"]), "Submit"),
    ) as { item: { id: string } };
    const watched = expectOk(await grpcurlRun([...auth, "-d", JSON.stringify({ id: submitted.item.id }), fylrAddress, "slotbroker.v1.QueueService/Watch"]), "Watch");
    expect(watched).to.include('"state": "ITEM_STATE_SUCCEEDED"');
    expect(watched).to.include(`"output": "${Buffer.from("6\n").toString("base64")}"`);
  });

  it("curl runs the queue API recipes of docs/protocol.md, with the token: Submit, Get, Position, Stats and Watch", async () => {
    const doc = readFileSync(join(root, "docs/protocol.md"), "utf8");
    // The recipes that run in order on one item; the control recipes below them are
    // covered by test/api/item-control.test.ts.
    const section = doc.slice(doc.indexOf("\n## The queue API"), doc.indexOf("\n### Control over items"));
    const blocks = [...section.matchAll(/```sh\n([\s\S]*?)```/g)].map((m) => m[1]!);
    expect(blocks.length).to.equal(5);
    // Run as written: the fylr's address comes in as $API (see the top of protocol.md).
    const script = ["set -euo pipefail", ...blocks].join("\n");
    expect(script).to.not.match(/:7700|127\.0\.0\.1/);
    expect(script.match(/authorization: Bearer \$SLOTBROKER_API_TOKEN/g)?.length, "every recipe sends the token").to.equal(4);
    const api = `http://${fylrAddress}`;
    const withoutToken = await run("bash", ["-c", script], { timeoutMs: 60_000, env: { ...process.env, API: api, SLOTBROKER_API_TOKEN: "" } });
    expect(withoutToken.stdout, "refused without the token").to.not.match(/^submitted [0-9a-f-]{36}$/m);
    const r = await run("bash", ["-c", script], { timeoutMs: 60_000, env: { ...process.env, API: api, SLOTBROKER_API_TOKEN: apiToken } });
    expect(r.code, r.stderr).to.equal(0);
    const lines = r.stdout.split("\n");
    const id = /^submitted ([0-9a-f-]{36})$/.exec(lines[0]!)?.[1];
    expect(id, r.stdout).to.be.a("string");
    // The traceparent recipe: a second item, accepted with the header (this fylr records no traces).
    const traced = JSON.parse(lines[1]!) as { item: { id: string } };
    expect(traced.item.id).to.match(/^[0-9a-f-]{36}$/).and.not.equal(id);
    const get = JSON.parse(lines[2]!) as { item: { id: string; priority: number } };
    expect(get.item).to.include({ id, priority: 5 });
    expect(JSON.parse(lines[3]!)).to.have.property("position");
    expect((JSON.parse(lines[4]!) as { fylrId: string }).fylrId).to.equal(fylr.id);
    // Watch: envelopes (NUL bytes turned into newlines by tr), the last message the end state.
    const digest = createHash("sha256").update("hello\n").digest("hex");
    const end = `\n\n\n${String.fromCharCode(2)}{}\n`;
    const watchOut = r.stdout.slice(0, r.stdout.lastIndexOf(end));
    const states = [...watchOut.matchAll(/"state":"(ITEM_STATE_[A-Z]+)"/g)].map((m) => m[1]);
    expect(states.at(-1)).to.equal("ITEM_STATE_SUCCEEDED");
    expect(r.stdout).to.include(`"output":"${Buffer.from(`${digest}  -\n`).toString("base64")}"`);
    // The end-of-stream envelope: flags 2, then an empty JSON object; then the fairness-key recipe's answer.
    expect(r.stdout, "Watch's end of stream").to.include(end);
    const keyed = JSON.parse(r.stdout.slice(r.stdout.lastIndexOf(end) + end.length)) as { item: { fairnessKey: string; fairnessWeight: number } };
    expect(keyed.item).to.include({ fairnessKey: "tenant-42", fairnessWeight: 2 });
  });

  it("curl: a plain JSON POST to Watch is refused with 415, and a typo is a 400 naming the field", async () => {
    const auth = ["-H", `authorization: Bearer ${apiToken}`];
    const watch = await run("curl", ["-s", "-o", "/dev/null", "-w", "%{http_code}", ...auth, "-X", "POST", "-H", "Content-Type: application/json", "-d", "{}", `${fylr.url}/slotbroker.v1.QueueService/Watch`]);
    expect(watch.stdout).to.equal("415");
    const typo = await run("curl", [
      "-s",
      "-w",
      "\n%{http_code}",
      ...auth,
      "-X",
      "POST",
      "-H",
      "Content-Type: application/json",
      "-d",
      '{"calls":[{"service":"wc","stdinDta":"aGVsbG8K"}],"priorty":9}',
      `${fylr.url}/slotbroker.v1.QueueService/Submit`,
    ]);
    const [body, status] = typo.stdout.split("\n");
    expect(status).to.equal("400");
    expect(JSON.parse(body!)).to.deep.include({ code: "invalid_argument" });
    expect(body).to.include('\\"stdinDta\\" is unknown');
  });
});
