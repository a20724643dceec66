import { expect } from "chai";
import { chmodSync, existsSync, mkdtempSync, readFileSync, rmSync } from "node:fs";
import { createServer, type Server } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { startEmbeddedPostgres } from "../../src/shared/embedded-postgres.js";
import { freePort, isAddressInUse, parsePortRange, pickRangeOutside, withFreePort, withFreePorts } from "../../src/shared/free-port.js";

const rangeFile = "/proc/sys/net/ipv4/ip_local_port_range";

function listenOn(port: number): Promise<Server> {
  const server = createServer();
  return new Promise((resolve, reject) => {
    server.once("error", reject);
    server.listen({ host: "127.0.0.1", port, exclusive: true }, () => resolve(server));
  });
}

const close = (server: Server): Promise<void> => new Promise((resolve) => server.close(() => resolve()));

describe("free ports", () => {
  it("reads the kernel's ephemeral range and picks below it, else above it, else nowhere", () => {
    expect(parsePortRange("32768\t60999\n")).to.deep.equal({ low: 32768, high: 60999 });
    expect(parsePortRange("nonsense")).to.equal(undefined);
    expect(parsePortRange("5000 4000")).to.equal(undefined);
    expect(pickRangeOutside({ low: 32768, high: 60999 })).to.deep.equal({ low: 16384, high: 32767 });
    expect(pickRangeOutside({ low: 10500, high: 60999 })).to.deep.equal({ low: 61000, high: 65535 });
    expect(pickRangeOutside({ low: 1024, high: 65000 })).to.equal(undefined);
  });

  it("hands out a port that is free now and outside the ephemeral range, where bind(0) never lands", async function () {
    if (!existsSync(rangeFile)) this.skip();
    const ephemeral = parsePortRange(readFileSync(rangeFile, "utf8"))!;
    const port = await freePort();
    expect(port < ephemeral.low || port > ephemeral.high, `${port} inside ${ephemeral.low}-${ephemeral.high}`).to.equal(true);
    await close(await listenOn(port));
  });

  it("recognises a taken port in a Node error and in a server's own words", async () => {
    const held = await listenOn(0);
    const port = (held.address() as { port: number }).port;
    const err = await listenOn(port).then(
      (s) => close(s).then(() => expect.fail("bound a taken port")),
      (e: unknown) => e,
    );
    await close(held);
    expect(isAddressInUse(err)).to.equal(true);
    expect(isAddressInUse(new Error("haproxy exited with 1: cannot bind socket (Address already in use) [127.0.0.1:1234]"))).to.equal(true);
    expect(isAddressInUse(new Error("ECONNREFUSED"))).to.equal(false);
    expect(isAddressInUse(undefined)).to.equal(false);
  });

  it("starts again on fresh ports when a start finds one taken, and only then", async () => {
    const tried: number[][] = [];
    const started = await withFreePorts(2, (ports) => {
      tried.push(ports);
      if (tried.length < 3) return Promise.reject(Object.assign(new Error(`listen EADDRINUSE: 127.0.0.1:${ports[0]}`), { code: "EADDRINUSE" }));
      return Promise.resolve(ports);
    });
    expect(tried).to.have.lengthOf(3);
    expect(started).to.equal(tried[2]);
    for (const ports of tried) expect(new Set(ports).size).to.equal(2);

    let calls = 0;
    const other = await withFreePort(() => {
      calls += 1;
      return Promise.reject(new Error("config invalid"));
    }).catch((e: Error) => e);
    expect(other.message).to.equal("config invalid");
    expect(calls).to.equal(1);

    calls = 0;
    const always = await withFreePort(() => {
      calls += 1;
      return Promise.reject(new Error("address already in use"));
    }, 2).catch((e: Error) => e);
    expect(always.message).to.equal("address already in use");
    expect(calls).to.equal(2);
  });

  it("embedded PostgreSQL on a taken port fails with an error recognised as a taken port", async function () {
    this.timeout(120_000);
    const dir = mkdtempSync(join(tmpdir(), "slotbroker-pgport-"));
    chmodSync(dir, 0o755); // the server runs as the "postgres" user when we are root
    const held = await listenOn(0);
    try {
      const port = (held.address() as { port: number }).port;
      const err = await startEmbeddedPostgres({ dataDir: join(dir, "data"), port, persistent: false }).then(
        (pg) => pg.stop().then(() => expect.fail("started on a taken port")),
        (e: unknown) => e,
      );
      expect(isAddressInUse(err), String(err)).to.equal(true);
    } finally {
      await close(held);
      rmSync(dir, { recursive: true, force: true });
    }
  });
});
