// `slotbroker fylr --config FILE`: a bad config names the key and exits non-zero; the
// compiled config has the documented defaults.
import { expect } from "chai";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { compileFylrConfig } from "../../src/app/index.js";
import { slotbroker } from "../integration/support.js";

describe("slotbroker fylr --config", () => {
  let dir: string;
  beforeEach(() => {
    dir = mkdtempSync(join(tmpdir(), "slotbroker-fylr-config-"));
  });
  afterEach(() => {
    rmSync(dir, { recursive: true, force: true });
  });

  const run = async (yaml: string, env: NodeJS.ProcessEnv = {}): Promise<{ code: number | null; stderr: string }> => {
    const path = join(dir, "fylr.yaml");
    writeFileSync(path, yaml);
    const noDatabase = { DATABASE_URL: "", ...env };
    const { code, stderr } = await slotbroker(["fylr", "--config", path], { env: noDatabase, timeoutMs: 30_000 });
    return { code, stderr };
  };
  const db = "databaseUrl: postgres://u:p@127.0.0.1:1/x\n";

  it("names an unknown key, a bad value and a missing one, and exits 1", async function () {
    this.timeout(60_000);
    const cases: [string, RegExp][] = [
      [`${db}execserver: { addresses: [127.0.0.1:7600] }\ndispatcher: { pollIntervall: 1s }\n`, /invalid config: .*fylr\.yaml: unknown key "dispatcher\.pollIntervall"/],
      [`${db}execserver: { addresses: [127.0.0.1:7600], connectTimeout: 30 }\n`, /execserver\.connectTimeout: /],
      [`${db}execserver: { addresses: [localhost] }\n`, /execserver\.addresses\.0: expected "host:port"/],
      [`${db}listen: 7700\nexecserver: { addresses: [127.0.0.1:7600] }\n`, /listen: /],
      [`execserver: { addresses: [127.0.0.1:7600] }\n`, /databaseUrl: required \(or set DATABASE_URL\)/],
      [`${db}\n`, /execserver: /],
      [`${db}execserver: { addresses: [127.0.0.1:7600] }\ndispatcher: { heartbeatInterval: 1s, staleAfter: 2s }\n`, /dispatcher\.staleAfter: must be at least 3 × heartbeatInterval/],
      [`${db}execserver: { addresses: [127.0.0.1:7600] }\nlisen: 127.0.0.1:1\n`, /unknown key "lisen"/],
    ];
    for (const [yaml, message] of cases) {
      const { code, stderr } = await run(yaml);
      expect(code, yaml).to.equal(1);
      expect(stderr, yaml).to.match(message);
    }
  });

  it("exits 2 without --config and 1 for a file it cannot read", async function () {
    this.timeout(30_000);
    expect((await slotbroker(["fylr"])).code).to.equal(2);
    const missing = await slotbroker(["fylr", "--config", join(dir, "nope.yaml")]);
    expect(missing.code).to.equal(1);
    expect(missing.stderr).to.match(/cannot read config file .*nope\.yaml/);
  });

  it("compiles defaults, fills the database from DATABASE_URL and takes the token from SLOTBROKER_TOKEN", () => {
    const config = compileFylrConfig({ name: "a", execserver: { addresses: ["127.0.0.1:7600"] } }, "t", {
      DATABASE_URL: "postgres://env@127.0.0.1/db",
      SLOTBROKER_TOKEN: "secret",
    });
    expect(config.id).to.match(/^a-[0-9a-f]{8}$/);
    expect(config).to.deep.include({ listen: "127.0.0.1:7700", databaseUrl: "postgres://env@127.0.0.1/db", databasePoolSize: 10, watchPollMs: 500 });
    expect(config.broker).to.deep.include({ token: "secret", connectTimeoutMs: 30_000, positionIntervalMs: 1000, clientName: config.id });
    expect(config.dispatcher).to.deep.include({ headroom: 2, pollIntervalMs: 1000, staleAfterMs: 15_000 });
    // The file's database wins over the environment's.
    const fromFile = compileFylrConfig({ databaseUrl: "postgres://file@h/d", execserver: { addresses: ["h:1"] } }, "t", { DATABASE_URL: "postgres://env@h/d" });
    expect(fromFile.databaseUrl).to.equal("postgres://file@h/d");
  });

  it("keeps a numeric-looking token and name as strings", () => {
    const config = compileFylrConfig({ execserver: { addresses: ["h:1"] } }, "t", {
      DATABASE_URL: "postgres://h/d",
      SLOTBROKER_TOKEN: "123456",
      SLOTBROKER_FYLR_NAME: "42",
    });
    expect(config.broker.token).to.equal("123456");
    expect(config.id).to.match(/^42-[0-9a-f]{8}$/);
  });
});
