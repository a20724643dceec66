import { expect } from "chai";
import { setTimeout as sleep } from "node:timers/promises";
import { HelloBroadcast, type HelloAudience } from "../../src/execserver/hello-broadcast.js";

// An audience that only counts broadcasts.
function audience(streams: number): HelloAudience & { broadcasts: number; streamCount: number; isStopped: boolean } {
  return {
    broadcasts: 0,
    streamCount: streams,
    isStopped: false,
    streams() {
      return this.streamCount;
    },
    stopped() {
      return this.isStopped;
    },
    broadcast() {
      this.broadcasts++;
    },
  };
}

describe("execserver Hello broadcast", () => {
  it("gathers the changes of one window into one broadcast, and counts every change", async () => {
    const peers = audience(3);
    const broadcasted = new Promise<void>((resolve) => {
      peers.broadcast = () => {
        peers.broadcasts++;
        resolve();
      };
    });
    const hello = new HelloBroadcast(peers, { coalesceMs: 10 });
    for (let i = 0; i < 5; i++) hello.changed();
    expect(hello.version).to.equal(5);
    expect(peers.broadcasts).to.equal(0);
    await broadcasted;
    expect(peers.broadcasts).to.equal(1);
  });

  it("widens the window with the streams so a broadcast stays within its frame budget", () => {
    const peers = audience(0);
    const hello = new HelloBroadcast(peers, { coalesceMs: 10, framesPerSecond: 100 });
    expect(hello.windowMs()).to.equal(10);
    peers.streamCount = 20;
    expect(hello.windowMs()).to.equal(200);
    expect(new HelloBroadcast(audience(10_000)).windowMs()).to.equal(5_000);
    expect(new HelloBroadcast(audience(10)).windowMs()).to.equal(100);
  });

  it("flushes at once instead of at the end of the window, and not to nobody", async () => {
    const peers = audience(2);
    const hello = new HelloBroadcast(peers, { coalesceMs: 10 });
    hello.changed();
    hello.flush();
    expect(peers.broadcasts).to.equal(1);
    await sleep(30);
    expect(peers.broadcasts, "the scheduled broadcast was dropped").to.equal(1);
    peers.streamCount = 0;
    hello.flush();
    expect(peers.broadcasts).to.equal(1);
  });

  it("schedules nothing once stopped, and cancel drops a scheduled broadcast", async () => {
    const peers = audience(2);
    const hello = new HelloBroadcast(peers, { coalesceMs: 10 });
    hello.changed();
    hello.cancel();
    peers.isStopped = true;
    hello.changed();
    await sleep(30);
    expect(peers.broadcasts).to.equal(0);
    expect(hello.version).to.equal(2);
  });
});
