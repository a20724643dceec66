import { expect } from "chai";
import { create } from "@bufbuild/protobuf";
import { HelloSchema, type Hello } from "../../gen/slotbroker/v1/broker_pb.js";
import { ParkedWants, ReconnectBackoff } from "../../src/fylr/broker/connection-state.js";
import { listedAnywhere, unknownServiceError, type ListingConnection, StartupGrace } from "../../src/fylr/broker/service-listing.js";
import { RaceBook, WantRace } from "../../src/fylr/broker/want-race.js";

const hello = (services: Record<string, string>, draining = false): Hello => create(HelloSchema, { instanceId: "i", services, draining });

describe("fylr broker parts (pure)", () => {
  describe("parked wants of a connection", () => {
    it("keeps wants oldest first, takes one for an OFFER and drops what a HELLO no longer serves", () => {
      const wants = new ParkedWants();
      expect(wants.oldestParkedAt()).to.equal(undefined);
      wants.add("a", { service: "cat", priority: 0, fairnessKey: "t1", fairnessWeight: 3, parkedAt: 10 });
      wants.add("b", { service: "sox", priority: 1, fairnessKey: "", fairnessWeight: 0, parkedAt: 20 });
      wants.add("c", { service: "cat", priority: 0, fairnessKey: "", fairnessWeight: 0, parkedAt: 30 });
      expect(wants.oldestParkedAt()).to.equal(10);
      expect(wants.take("a")).to.deep.equal({ service: "cat", priority: 0, fairnessKey: "t1", fairnessWeight: 3, parkedAt: 10 });
      expect(wants.take("a"), "taken once").to.equal(undefined);
      expect(wants.oldestParkedAt()).to.equal(20);
      expect(wants.dropUnserved(hello({ cat: "wg" }))).to.deep.equal(["b"]);
      expect([...wants.entries()].map(([id]) => id)).to.deep.equal(["c"]);
      expect(wants.dropUnserved(hello({ cat: "wg" }, true)), "a draining instance serves nothing").to.deep.equal(["c"]);
      expect(wants.size).to.equal(0);
      wants.add("d", { service: "cat", priority: 0, fairnessKey: "", fairnessWeight: 0, parkedAt: 40 });
      expect(wants.clear()).to.deep.equal(["d"]);
    });
  });

  describe("reconnect backoff", () => {
    it("grows while streams fail early and starts over after a stream that stayed up", () => {
      const backoff = new ReconnectBackoff({ initialMs: 100, maxMs: 1000, multiplier: 2 });
      expect(backoff.down(false, 0)).to.deep.equal({ delayMs: 100, failures: 1 });
      expect(backoff.down(false, 0)).to.deep.equal({ delayMs: 200, failures: 2 });
      backoff.ready(1_000);
      expect(backoff.down(true, 1_500), "ready but dropped at once").to.deep.equal({ delayMs: 400, failures: 3 });
      backoff.ready(2_000);
      expect(backoff.down(true, 3_000), "stable for a second").to.deep.equal({ delayMs: 100, failures: 0 });
    });
  });

  describe("who takes an offer", () => {
    it("its own parked want; a surplus one still good here goes to the oldest want parked here in that class", () => {
      const book = new RaceBook<string>();
      const [low, old, young] = [new WantRace<string>("low", "cat", 0, 0), new WantRace<string>("old", "cat", 5, 0), new WantRace<string>("young", "cat", 5, 0)];
      for (const race of [low, old, young]) {
        book.add(race);
        race.park("a");
      }
      expect(book.takerOf("old", "a", { service: "cat", priority: 5 })).to.deep.equal({ race: old, substitute: false });
      book.delete(old);
      old.offer("b");
      expect(book.takerOf("old", "a", { service: "cat", priority: 5 })).to.deep.equal({ race: young, substitute: true });
      expect(book.takerOf("old", "a", undefined), "UNWANTed here: decline").to.equal(undefined);
      expect(book.takerOf("old", "b", { service: "cat", priority: 5 }), "nothing parked on b").to.equal(undefined);
      expect(book.takerOf("old", "a", { service: "cat", priority: 9 }), "no want in that class").to.equal(undefined);
    });
  });

  describe("who takes an offer (what went wrong before)", () => {
    it("declines an offer on a connection the want was UNWANTed from, though it still waits elsewhere (the server withdrew that offer)", () => {
      const book = new RaceBook<string>();
      const race = new WantRace<string>("x", "cat", 0, 0);
      book.add(race);
      race.park("b");
      expect(book.takerOf("x", "a", undefined)).to.equal(undefined);
      expect(book.takerOf("x", "b", { service: "cat", priority: 0 })).to.deep.equal({ race, substitute: false });
    });

    it("hands a surplus offer to the most urgent want parked there, the oldest within its class", () => {
      const book = new RaceBook<string>();
      const races = [new WantRace<string>("old-low", "cat", 0, 0), new WantRace<string>("urgent", "cat", 5, 0), new WantRace<string>("urgent-2", "cat", 5, 0)];
      for (const race of races) {
        book.add(race);
        race.park("a");
      }
      expect(book.takerOf("won-elsewhere", "a", { service: "cat", priority: 0 })).to.deep.equal({ race: races[1], substitute: true });
    });
  });

  describe("service listing", () => {
    const ready = (services: Record<string, string>, draining = false): ListingConnection => ({ state: "ready", hello: hello(services, draining) });

    it("fails fast only when connected instances exist and none lists the service", () => {
      expect(listedAnywhere([], [], "cat"), "nothing connected yet").to.equal(true);
      expect(listedAnywhere([], [{ state: "connecting", hello: undefined }], "cat")).to.equal(true);
      expect(listedAnywhere([], [ready({ sox: "wg" })], "cat")).to.equal(false);
      expect(listedAnywhere([], [ready({ cat: "wg" }, true)], "cat"), "a draining instance still lists it").to.equal(true);
      const polled = { transport: "polling" as const, mayServe: (s: string) => s === "cat" };
      expect(listedAnywhere([polled], [ready({ sox: "wg" })], "cat")).to.equal(true);
      expect(listedAnywhere([polled], [], "ffmpeg")).to.equal(false);
      expect(unknownServiceError("cat", [ready({ sox: "wg", ffmpeg: "wg" }), ready({ sox: "wg" })], 1).message).to.equal(
        'no execserver offers service "cat" (3 connected instances offer: "ffmpeg", "sox")',
      );
    });
  });

  describe("start-up grace", () => {
    it("waits until the pools settled, the grace passed or the client closed", async () => {
      let settled = false;
      const grace = new StartupGrace(60_000, () => settled);
      expect(grace.isSettled(), "not started").to.equal(true);
      grace.begin(1_000);
      expect(grace.isSettled(2_000)).to.equal(false);
      expect(grace.isSettled(61_000)).to.equal(true);
      grace.begin();
      const waited = grace.wait(undefined);
      settled = true;
      grace.wake();
      await waited;
      settled = false;
      const closing = grace.wait(undefined);
      grace.end();
      await closing;
      grace.begin();
      const abort = new AbortController();
      const aborted = grace.wait(abort.signal);
      abort.abort(new Error("shutdown"));
      let err: unknown;
      await aborted.catch((e: unknown) => (err = e));
      expect(err).to.be.an("error").with.property("message", "shutdown");
    });
  });
});
