// The store's room arithmetic, pure: what a write reserves, what the disk allows, when a
// VACUUM is due; and the `store:` keys that feed it.
import { expect } from "chai";
import { capToDisk, compileStoreConfig, floorBytes, nextAsk, openingAsk, VacuumPacer } from "../../src/dispatcher/index.js";
import { ConfigError } from "../../src/shared/errors.js";

const MiB = 1 << 20;
const GiB = 1 << 30;

describe("store room arithmetic", () => {
  it("a write reserves its announced size exactly, one step ahead when the size is unknown, nothing for an empty body", () => {
    expect(openingAsk(500 * MiB, 16 * MiB, 64 * GiB)).to.deep.equal({ want: 500 * MiB, least: 500 * MiB });
    expect(openingAsk(undefined, 16 * MiB, 64 * GiB)).to.deep.equal({ want: 16 * MiB, least: 1 });
    expect(openingAsk(undefined, 16 * MiB, MiB)).to.deep.equal({ want: MiB, least: 1 });
    expect(openingAsk(0, 16 * MiB, 64 * GiB)).to.equal(undefined);
  });

  it("asks for more only when the bytes pass what it holds: a step ahead, never past the item limit, at least what it needs", () => {
    expect(nextAsk(10 * MiB, 16 * MiB, 16 * MiB, 64 * GiB)).to.equal(undefined);
    expect(nextAsk(16 * MiB, 16 * MiB, 16 * MiB, 64 * GiB)).to.equal(undefined);
    expect(nextAsk(16 * MiB + 1, 16 * MiB, 16 * MiB, 64 * GiB)).to.deep.equal({ want: 32 * MiB + 1, least: 16 * MiB + 1 });
    expect(nextAsk(20 * MiB, 16 * MiB, 16 * MiB, 24 * MiB)).to.deep.equal({ want: 24 * MiB, least: 20 * MiB });
  });

  it("the disk takes about twice what is stored, plus a WAL segment, above its floor; an ask is cut to that, or refused below its least", () => {
    const space = { total: 300 * MiB, free: 146 * MiB };
    // (146 - 30 - 16) / 2 = 50 MiB more.
    expect(capToDisk({ want: 500 * MiB, least: 500 * MiB }, 0, space, 30 * MiB)).to.equal(undefined);
    expect(capToDisk({ want: 16 * MiB, least: 1 }, 0, space, 30 * MiB)).to.deep.equal({ want: 16 * MiB, least: 1 });
    expect(capToDisk({ want: 80 * MiB, least: 66 * MiB }, 16 * MiB, space, 30 * MiB)).to.deep.equal({ want: 66 * MiB, least: 66 * MiB });
    expect(capToDisk({ want: 80 * MiB, least: 67 * MiB }, 16 * MiB, space, 30 * MiB)).to.equal(undefined);
    expect(capToDisk({ want: 1, least: 1 }, 0, { total: 300 * MiB, free: 46 * MiB }, 30 * MiB)).to.equal(undefined);
    expect(capToDisk({ want: 1, least: 1 }, 0, { total: 300 * MiB, free: 46 * MiB + 2 }, 30 * MiB)).to.deep.equal({ want: 1, least: 1 });
  });

  it("a floor is bytes, or a share of the filesystem", () => {
    expect(floorBytes({ bytes: 2 * GiB }, 100 * GiB)).to.equal(2 * GiB);
    expect(floorBytes({ percent: 10 }, 300 * MiB)).to.equal(30 * MiB);
  });

  it("a VACUUM is due once enough dead bytes piled up, at most once per interval, and again when it could give back little", () => {
    const pacer = new VacuumPacer(64 * MiB, 10_000);
    pacer.note(60 * MiB);
    expect(pacer.due(0)).to.equal(false);
    pacer.note(4 * MiB);
    expect(pacer.due(0)).to.equal(true);
    expect(pacer.start(0)).to.equal(64 * MiB);
    pacer.finish(64 * MiB, 64 * MiB);
    pacer.note(100 * MiB);
    expect(pacer.due(9_999)).to.equal(false);
    expect(pacer.due(10_000)).to.equal(true);
    // A VACUUM that freed little (a write elsewhere held the table's end) is tried again, a few times in a row at most.
    let now = 10_000;
    for (let i = 0; i < VacuumPacer.retries; i++) {
      const noted = pacer.start(now);
      pacer.finish(noted, 0);
      now += 10_000;
      expect(pacer.due(now), `retry ${i + 1}`).to.equal(true);
    }
    pacer.finish(pacer.start(now), 0);
    expect(pacer.due(now + 10_000)).to.equal(false);
    pacer.note(64 * MiB);
    const noted = pacer.start(now + 10_000);
    pacer.finish(noted, undefined);
    expect(pacer.due(now + 20_000), "a failed VACUUM is tried again").to.equal(true);
  });
});

describe("store config: the quota, the free-space floor and the VACUUM", () => {
  it("defaults to a 16 GiB quota, 10 % free, a VACUUM after 64 MiB at most every 10 s, and no disk path", () => {
    expect(compileStoreConfig({})).to.deep.include({ maxTotalBytes: 16 * GiB, minFreeSpace: { percent: 10 }, vacuumAfterBytes: 64 * MiB, vacuumIntervalMs: 10_000, diskPath: undefined });
  });

  it("takes the floor as a share or a size, and names the key of a bad one", () => {
    expect(compileStoreConfig({ minFreeSpace: "2.5%" }).minFreeSpace).to.deep.equal({ percent: 2.5 });
    expect(compileStoreConfig({ minFreeSpace: "2GiB" }).minFreeSpace).to.deep.equal({ bytes: 2 * GiB });
    expect(compileStoreConfig({ minFreeSpace: 0 }).minFreeSpace).to.deep.equal({ bytes: 0 });
    expect(() => compileStoreConfig({ minFreeSpace: "100%" }, "fylr.yaml store")).to.throw(ConfigError, /fylr\.yaml store: minFreeSpace: must be below 100%/);
    expect(() => compileStoreConfig({ minFreeSpace: "lots" })).to.throw(ConfigError, /minFreeSpace: expected a share of the filesystem such as "10%" or a size such as "2GiB", got "lots"/);
    expect(() => compileStoreConfig({ vacuumInterval: "0s" })).to.throw(ConfigError, /vacuumInterval: must be longer than 0/);
  });
});
