// The pure parts of the fylr's API auth: scopes, the token set, client certificate names,
// the tokens file and the config rules (the loopback rule among them).
import { expect } from "chai";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { QueueService } from "../../gen/slotbroker/v1/queue_pb.js";
import { compileFylrConfig } from "../../src/app/index.js";
import {
  allows,
  ApiTokens,
  certificateNames,
  matchClientRules,
  parseTokensFile,
  queueProcedureScopes,
  tokenDigest,
  TokenSet,
  type Scope,
} from "../../src/fylr/index.js";

const reader = "reader-token-0123456789";
const admin = "admin-token-0123456789ab";

describe("fylr API auth: the pure parts", () => {
  it("scopes: admin may do anything, the others only themselves", () => {
    const set = (...s: Scope[]): Set<Scope> => new Set(s);
    expect(allows(set("read"), "read")).to.equal(true);
    expect(allows(set("read"), "submit")).to.equal(false);
    expect(allows(set("submit"), "read")).to.equal(false);
    expect(allows(set("submit", "read"), "read")).to.equal(true);
    expect(allows(set("admin"), "read")).to.equal(true);
    expect(allows(set("admin"), "submit")).to.equal(true);
    expect(allows(set(), "read")).to.equal(false);
  });

  it("every QueueService method has a scope: Submit submit; Cancel, Retry, Delete admin; the rest read", () => {
    const paths = QueueService.methods.map((m) => `/${QueueService.typeName}/${m.name}`);
    expect([...queueProcedureScopes.keys()].sort()).to.deep.equal(paths.sort());
    const by = (scope: Scope): string[] => [...queueProcedureScopes].filter(([, s]) => s === scope).map(([p]) => p.split("/")[2]!).sort();
    expect(by("submit")).to.deep.equal(["Submit"]);
    expect(by("admin")).to.deep.equal(["Cancel", "Delete", "Retry"]);
    expect(by("read")).to.deep.equal(["Get", "History", "List", "ListKeys", "Position", "Stats", "Watch"]);
  });

  it("a token set finds a token by its value or its SHA-256, and nothing else", () => {
    const set = new TokenSet([
      { name: "reader", token: reader, scopes: ["read"] },
      { name: "ops", sha256: tokenDigest(admin).toString("hex").toUpperCase(), scopes: ["admin"] },
    ]);
    expect(set.find(reader)?.name).to.equal("reader");
    expect([...set.find(admin)!.scopes]).to.deep.equal(["admin"]);
    expect(set.find(`${reader}x`)).to.equal(undefined);
    expect(set.find(reader.slice(0, -1))).to.equal(undefined);
    expect(set.find("")).to.equal(undefined);
    expect(set.names()).to.deep.equal(["reader", "ops"]);
  });

  it("a token set refuses a name or a token used twice, naming the entry", () => {
    expect(() => new TokenSet([{ name: "a", token: reader, scopes: ["read"] }, { name: "a", token: admin, scopes: ["admin"] }])).to.throw('token "a": the name is used twice');
    expect(
      () => new TokenSet([{ name: "a", token: reader, scopes: ["read"] }, { name: "b", sha256: tokenDigest(reader).toString("hex"), scopes: ["admin"] }]),
    ).to.throw('token "b": the same token as "a"');
  });

  it("a client certificate is named by its CN and every subjectAltName value", () => {
    const cert = { subject: { CN: "ops-client" }, subjectaltname: 'DNS:ops.example.com, IP Address:10.0.0.5, URI:spiffe://example/ops, DNS:"a, b"' };
    expect(certificateNames(cert)).to.deep.equal(["ops-client", "ops.example.com", "10.0.0.5", "spiffe://example/ops", "a, b"]);
    const rules = [
      { subject: "spiffe://example/ops", scopes: ["admin" as Scope] },
      { subject: "reader.example.com", scopes: ["read" as Scope] },
    ];
    expect(matchClientRules(rules, cert)?.name).to.equal("spiffe://example/ops");
    expect(matchClientRules(rules, { subject: { CN: "reader.example.com" } })?.scopes.has("read")).to.equal(true);
    expect(matchClientRules(rules, { subject: { CN: "someone" } })).to.equal(undefined);
  });

  it("a tokens file is YAML `tokens: [...]`; a bad entry is named by its key", () => {
    expect(parseTokensFile(`tokens:\n  - { name: ci, token: ${reader}, scopes: [submit, read] }\n`)).to.deep.equal([
      { name: "ci", token: reader, scopes: ["submit", "read"] },
    ]);
    expect(() => parseTokensFile("tokens:\n  - { name: ci, token: short, scopes: [read] }\n")).to.throw(/tokens\.0\.token: at least 16 characters/);
    expect(() => parseTokensFile(`tokens:\n  - { name: ci, token: ${reader}, scopes: [write] }\n`)).to.throw(/tokens\.0\.scopes\.0: /);
    expect(() => parseTokensFile(`tokens:\n  - { name: ci, scopes: [read] }\n`)).to.throw(/give either "token" or "sha256"/);
    expect(() => parseTokensFile("tokens: [\n")).to.throw(/invalid YAML/);
  });

  describe("config", () => {
    const base = { databaseUrl: "postgres://u@127.0.0.1/db", execserver: { addresses: ["127.0.0.1:7600"] } };

    it("a non-loopback listen without any credential is refused, naming auth and the address", () => {
      for (const listen of ["0.0.0.0:7700", "[::]:7700", "10.0.0.5:7700"]) {
        expect(() => compileFylrConfig({ ...base, listen }, "f.yaml")).to.throw(`f.yaml: auth: required when listen (${listen}) is not a loopback address`);
      }
      for (const listen of ["127.0.0.1:7700", "[::1]:7700", "localhost:7700"]) expect(compileFylrConfig({ ...base, listen }).auth).to.equal(undefined);
    });

    it("tokens, a tokens file or client rules each count as credentials", () => {
      const listen = "0.0.0.0:7700";
      const tls = { certFile: "c.pem", keyFile: "k.pem", clientCaFile: "ca.pem" };
      expect(compileFylrConfig({ ...base, listen, auth: { tokens: [{ name: "ci", token: reader, scopes: ["read"] }] } }).auth?.tokens).to.have.length(1);
      expect(compileFylrConfig({ ...base, listen, auth: { tokensFile: "/etc/t.yaml" } }).auth?.reloadIntervalMs).to.equal(5000);
      expect(compileFylrConfig({ ...base, listen, tls, auth: { clients: [{ subject: "ops", scopes: ["admin"] }] } }).auth?.clients).to.have.length(1);
    });

    it("tokens come from SLOTBROKER_API_TOKENS (JSON) and the file from SLOTBROKER_API_TOKENS_FILE", () => {
      const env = { SLOTBROKER_API_TOKENS: JSON.stringify([{ name: "env", token: admin, scopes: ["admin"] }]), SLOTBROKER_API_TOKENS_FILE: "/run/secrets/t.yaml" };
      const auth = compileFylrConfig({ ...base, listen: "0.0.0.0:7700" }, "t", env).auth!;
      expect(auth.tokens.map((t) => t.name)).to.deep.equal(["env"]);
      expect(auth.tokensFile).to.equal("/run/secrets/t.yaml");
    });

    it("client rules need a client CA, a client CA needs rules, and tokens must be distinct", () => {
      const tls = { certFile: "c.pem", keyFile: "k.pem" };
      expect(() => compileFylrConfig({ ...base, tls, auth: { clients: [{ subject: "ops", scopes: ["admin"] }] } }, "f")).to.throw("f: auth.clients: needs tls.clientCaFile");
      expect(() => compileFylrConfig({ ...base, tls: { ...tls, clientCaFile: "ca.pem" } }, "f")).to.throw("f: tls.clientCaFile: give auth.clients");
      const twice = [
        { name: "a", token: reader, scopes: ["read"] },
        { name: "b", token: reader, scopes: ["admin"] },
      ];
      expect(() => compileFylrConfig({ ...base, auth: { tokens: twice } }, "f")).to.throw('f: auth.tokens: token "b": the same token as "a"');
    });
  });

  describe("the tokens file, read again", () => {
    let dir: string;
    beforeEach(() => (dir = mkdtempSync(join(tmpdir(), "slotbroker-tokens-"))));
    afterEach(() => rmSync(dir, { recursive: true, force: true }));

    it("replaces the set when the file changed, keeps it when the new file is broken, and fails at start on a bad file", async () => {
      const file = join(dir, "tokens.yaml");
      writeFileSync(file, `tokens: [{ name: r, token: ${reader}, scopes: [read] }]\n`);
      const applied: TokenSet[] = [];
      const config = { tokens: [{ name: "inline", token: admin, scopes: ["admin" as Scope] }], tokensFile: file, reloadIntervalMs: 0, clients: [] };
      const tokens = await ApiTokens.start(config, (set) => applied.push(set));
      try {
        expect(applied.at(-1)!.names()).to.deep.equal(["inline", "r"]);
        expect(await tokens.reload()).to.deep.equal({ outcome: "unchanged", tokens: 2 });
        writeFileSync(file, `tokens: [{ name: r2, token: ${reader}-2, scopes: [read] }]\n`);
        expect(await tokens.reload()).to.deep.equal({ outcome: "replaced", tokens: 2 });
        expect(applied.at(-1)!.find(reader)).to.equal(undefined);
        expect(applied.at(-1)!.find(`${reader}-2`)?.name).to.equal("r2");
        writeFileSync(file, "tokens: [{ name: r3 }]\n");
        const broken = await tokens.reload();
        expect(broken.outcome).to.equal("failed");
        expect(applied.at(-1)!.find(`${reader}-2`)?.name, "the tokens before stay").to.equal("r2");
        rmSync(file);
        expect((await tokens.reload()).outcome).to.equal("failed");
      } finally {
        tokens.close();
      }
      const error = await ApiTokens.start(config, () => undefined).then(() => new Error("started"), (e: unknown) => e as Error);
      expect(error.message).to.match(/auth\.tokensFile: .*tokens\.yaml: cannot read it/);
    });
  });
});
