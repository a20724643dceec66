import { expect } from "chai";
import { create, fromBinary, toBinary } from "@bufbuild/protobuf";
import {
  ConnectResponseSchema,
  HelloSchema,
  JobSpecSchema,
  OfferSchema,
  RejectCode,
  WaitgroupStateSchema,
  type ConnectResponse,
} from "../../gen/slotbroker/v1/broker_pb.js";
import { BrokerCore, ClientConnection, type CoreEffects, type JobRecord, type OfferOutcome } from "../../src/execserver/broker-core.js";
import { compileExecserverConfig } from "../../src/execserver/config.js";
import { SlotLedger } from "../../src/execserver/slot-ledger.js";
import { helloFrame, OfferEncoder } from "../../src/execserver/frames.js";
import { durationFromMs } from "@bufbuild/protobuf/wkt";

// The broker core driven directly, with a hand-cranked clock and effects that only record.
class Recorder implements CoreEffects {
  offers: JobRecord[] = [];
  ended: [string, OfferOutcome][] = [];
  tokens: string[] = [];
  started: JobRecord[] = [];
  cancelled: JobRecord[] = [];
  offered(record: JobRecord): void {
    this.offers.push(record);
  }
  offerEnded(record: JobRecord, outcome: OfferOutcome, offerToken: string): void {
    this.ended.push([record.jobId, outcome]);
    this.tokens.push(offerToken);
  }
  start(record: JobRecord): void {
    this.started.push(record);
  }
  cancel(record: JobRecord): void {
    this.cancelled.push(record);
  }
}

function setup(processes = 1): { broker: BrokerCore; fx: Recorder; clock: { now: number }; conn: (id: string) => ClientConnection } {
  const config = compileExecserverConfig({ waitgroups: { g: { processes } }, services: { s: { waitgroup: "g", builtin: "noop" } } }, "t");
  const clock = { now: 0 };
  const fx = new Recorder();
  const broker = new BrokerCore({ ...config, offerTimeoutMs: 1000, now: () => clock.now }, fx);
  const sink = { send: (_frame: ConnectResponse | Uint8Array) => undefined };
  const conn = (id: string): ClientConnection => {
    const c = new ClientConnection(id, "127.0.0.1:1", "", new Date(), sink);
    broker.connect(c);
    return c;
  };
  return { broker, fx, clock, conn };
}

describe("broker core (execserver)", () => {
  it("expires offers in the order they were made, each freeing its slot for the next want", () => {
    const { broker, fx, clock, conn } = setup(2);
    const a = conn("a");
    const b = conn("b");
    broker.want(a, "a1", "s", 0);
    clock.now = 100;
    broker.want(a, "a2", "s", 0);
    broker.want(b, "b1", "s", 0);
    expect(fx.offers.map((r) => r.jobId)).to.deep.equal(["a1", "a2"]);
    expect(broker.nextExpiry()).to.equal(1000);
    clock.now = 999;
    expect(broker.expireDue()).to.equal(0);
    clock.now = 1000;
    expect(broker.expireDue()).to.equal(1);
    expect(fx.offers.map((r) => r.jobId)).to.deep.equal(["a1", "a2", "b1"]);
    expect(broker.nextExpiry()).to.equal(1100);
    // Accepting a2 takes it off the expiry list; b1 (made at 1000) is next.
    expect(broker.job(a, "a2", fx.offers[1]!.offerToken, undefined)).to.equal(undefined);
    expect(broker.nextExpiry()).to.equal(2000);
    expect(a.expired).to.equal(1);
    expect(fx.ended).to.deep.equal([["a1", "expired"], ["a2", "accepted"]]);
  });

  it("hands the expired offer's token to the effects, so the peer can be told which offer lapsed", () => {
    const { broker, fx, clock, conn } = setup(1);
    const a = conn("a");
    broker.want(a, "a1", "s", 0);
    const token = fx.offers[0]!.offerToken;
    clock.now = 1000;
    broker.expireDue();
    expect(fx.ended).to.deep.equal([["a1", "expired"]]);
    expect(fx.tokens).to.deep.equal([token]);
    // The job_id is free again: the same id parks anew.
    expect(broker.want(a, "a1", "s", 0)).to.equal(undefined);
    expect(fx.offers).to.have.length(2);
  });

  it("half-close withdraws a connection's parked wants and open offers, keeps its running job", () => {
    const { broker, fx, conn } = setup(2);
    const a = conn("a");
    const b = conn("b");
    broker.want(a, "run", "s", 0);
    broker.want(a, "offered", "s", 0);
    expect(broker.job(a, "run", fx.offers[0]!.offerToken, undefined)).to.equal(undefined);
    broker.want(a, "parked", "s", 5);
    broker.want(b, "b1", "s", 0);
    expect(broker.halfClose(a)).to.equal(1);
    expect(a.state).to.equal("half-closed");
    expect([...a.jobs.keys()]).to.deep.equal(["run"]);
    expect(fx.ended).to.deep.include(["offered", "withdrawn"]);
    // The withdrawn slot went to b at once, not to a's parked (higher priority) want.
    expect(fx.offers.map((r) => r.jobId)).to.deep.equal(["run", "offered", "b1"]);
    expect(fx.cancelled).to.deep.equal([]);
    broker.finish(fx.started[0]!);
    expect(a.running).to.equal(0);
    broker.disconnect(a);
    expect(fx.cancelled).to.deep.equal([]);
  });

  it("gives the slot of an offer withdrawn by UNWANT to the same connection's next want: it keeps its turn", () => {
    const { broker, fx, conn } = setup(1);
    const a = conn("a");
    const b = conn("b");
    broker.want(a, "a1", "s", 0);
    broker.want(a, "a2", "s", 0);
    broker.want(b, "b1", "s", 0);
    expect(fx.offers.map((r) => r.jobId)).to.deep.equal(["a1"]);
    // a1 won on another instance; its UNWANT crossed the offer on the wire.
    broker.unwant(a, "a1");
    expect(fx.ended).to.deep.equal([["a1", "withdrawn"]]);
    expect(fx.offers.map((r) => r.jobId)).to.deep.equal(["a1", "a2"]);
    // A DECLINE still ends the turn: the slot moves on to b.
    broker.decline(a, "a2", fx.offers[1]!.offerToken);
    expect(fx.offers.map((r) => r.jobId)).to.deep.equal(["a1", "a2", "b1"]);
    const ledger = broker.waitgroups.get("g")!.ledger;
    expect(ledger).to.include({ offered: 1, running: 0, free: 0 });
  });

  it("ends the turn on a DECLINE, an expiry or a refused JOB of an offer made at once: the slot goes to the next connection", () => {
    for (const end of ["decline", "expire", "bad-job"] as const) {
      const { broker, fx, clock, conn } = setup(1);
      const a = conn("a");
      const b = conn("b");
      broker.want(a, "a1", "s", 0);
      broker.want(a, "a2", "s", 0);
      broker.want(b, "b1", "s", 0);
      expect(fx.offers.map((r) => r.jobId)).to.deep.equal(["a1"]);
      if (end === "decline") broker.decline(a, "a1", fx.offers[0]!.offerToken);
      else if (end === "expire") {
        clock.now = 1000;
        broker.expireDue();
      } else {
        const spec = create(JobSpecSchema, { env: { NOT_ALLOWED: "x" } });
        expect(broker.job(a, "a1", fx.offers[0]!.offerToken, spec)?.code).to.equal(RejectCode.INVALID_ARGUMENT);
      }
      expect(fx.offers.map((r) => r.jobId), end).to.deep.equal(["a1", "b1"]);
      // a's next want is served in the next round.
      broker.decline(b, "b1", fx.offers[1]!.offerToken);
      expect(fx.offers.map((r) => r.jobId), end).to.deep.equal(["a1", "b1", "a2"]);
    }
  });

  it("ends the turn on a DECLINE of an offer that a withdrawal kept with the connection", () => {
    const { broker, fx, conn } = setup(1);
    const a = conn("a");
    const b = conn("b");
    broker.want(a, "a1", "s", 0);
    broker.want(a, "a2", "s", 0);
    broker.want(a, "a3", "s", 0);
    broker.want(b, "b1", "s", 0);
    broker.unwant(a, "a1");
    expect(fx.offers.map((r) => r.jobId)).to.deep.equal(["a1", "a2"]);
    broker.decline(a, "a2", fx.offers[1]!.offerToken);
    expect(fx.offers.map((r) => r.jobId)).to.deep.equal(["a1", "a2", "b1"]);
  });

  it("passes a withdrawn offer's slot on by the grant rule when a more urgent want waits", () => {
    const { broker, fx, conn } = setup(1);
    const a = conn("a");
    const b = conn("b");
    broker.want(a, "a1", "s", 0);
    broker.want(a, "a2", "s", 0);
    broker.want(b, "b-urgent", "s", 5);
    broker.unwant(a, "a1");
    expect(fx.offers.map((r) => r.jobId)).to.deep.equal(["a1", "b-urgent"]);
  });

  it("keeps a withdrawn offer's turn with its connection for one offer timeout at most: withdrawing again and again cannot hold the slot", () => {
    const { broker, fx, clock, conn } = setup(1);
    const [a, b, c] = [conn("a"), conn("b"), conn("c")];
    broker.want(c, "c1", "s", 0);
    for (let i = 1; i <= 5; i++) broker.want(a, `a${i}`, "s", 0);
    broker.want(b, "b1", "s", 0);
    // a's turn: a1. A burst of crossing UNWANTs within the turn: each replacement stays with a.
    broker.decline(c, "c1", fx.offers[0]!.offerToken);
    clock.now = 10;
    broker.unwant(a, "a1");
    broker.unwant(a, "a2");
    expect(fx.offers.map((r) => r.jobId)).to.deep.equal(["c1", "a1", "a2", "a3"]);
    // An offer timeout after the turn began, a withdrawal ends it: b is next.
    clock.now = 1000;
    broker.unwant(a, "a3");
    expect(fx.offers.map((r) => r.jobId)).to.deep.equal(["c1", "a1", "a2", "a3", "b1"]);
    expect(broker.waitgroups.get("g")!.ledger).to.include({ offered: 1, free: 0 });
  });

  it("keeps the slot ledger consistent through drops, declines and finishes", () => {
    const { broker, fx, conn } = setup(2);
    const a = conn("a");
    const b = conn("b");
    for (let i = 0; i < 5; i++) broker.want(a, `a${i}`, "s", i % 2);
    broker.want(b, "b0", "s", 1);
    const ledger = broker.waitgroups.get("g")!.ledger;
    expect(fx.offers.map((r) => r.jobId)).to.deep.equal(["a0", "a1"]);
    expect(ledger).to.include({ offered: 2, running: 0, free: 0 });
    broker.job(a, "a0", fx.offers[0]!.offerToken, undefined);
    expect(ledger).to.include({ offered: 1, running: 1, free: 0 });
    broker.disconnect(a);
    // a's running job is cancelled, its parked wants vanish, its offered slot goes to b0.
    expect(fx.cancelled.map((r) => r.jobId)).to.deep.equal(["a0"]);
    expect(fx.offers.map((r) => r.jobId)).to.deep.equal(["a0", "a1", "b0"]);
    expect(broker.waitgroups.get("g")!.book.size).to.equal(0);
    expect(ledger).to.include({ offered: 1, running: 1, free: 0 });
    broker.finish(fx.started[0]!);
    expect(ledger).to.include({ offered: 1, running: 0, free: 1, completed: 1 });
    broker.decline(b, "b0", fx.offers[2]!.offerToken);
    expect(ledger).to.include({ offered: 0, running: 0, free: 2 });
    expect(a.wantsParked).to.equal(0);
    expect(fx.ended).to.deep.equal([["a0", "accepted"], ["a1", "dropped"], ["b0", "declined"]]);
  });

  it("offers one connection's slots key by key, and rejects a bad fairness key or weight naming the field", () => {
    const { broker, fx, conn } = setup(1);
    const a = conn("a");
    broker.want(a, "running", "s", 0);
    for (let i = 0; i < 4; i++) broker.want(a, `big${i}`, "s", 0, "big", 2);
    broker.want(a, "small0", "s", 0, "small");
    broker.want(a, "plain0", "s", 0);
    const long = broker.want(a, "k", "s", 0, "k".repeat(129));
    expect(long).to.deep.equal({ code: RejectCode.INVALID_ARGUMENT, message: "fairness_key: longer than 128 bytes" });
    const heavy = broker.want(a, "w", "s", 0, "t", 1001);
    expect(heavy).to.deep.equal({ code: RejectCode.INVALID_ARGUMENT, message: "fairness_weight: 1001 is more than 1000" });
    expect(broker.want(a, "edge", "s", 0, "é".repeat(64), 1000)).to.equal(undefined);
    expect(a.rejects).to.equal(2);
    expect(broker.waitgroups.get("g")!.book.depth()).to.deep.equal([{ priority: 0, wants: 7, keys: 4 }]);
    for (let i = 0; i < 7; i++) {
      const offer = fx.offers.at(-1)!;
      expect(broker.job(a, offer.jobId, offer.offerToken, undefined)).to.equal(undefined);
      broker.finish(offer);
    }
    expect(fx.offers.map((r) => r.jobId)).to.deep.equal(["running", "big0", "big1", "small0", "plain0", "edge", "big2", "big3"]);
  });

  it("rejects JOBs and WANTs with DRAINING once draining, withdrawing the offer", () => {
    const { broker, fx, conn } = setup(1);
    const a = conn("a");
    broker.want(a, "x", "s", 0);
    broker.drain();
    expect(broker.want(a, "y", "s", 0)?.code).to.equal(RejectCode.DRAINING);
    expect(broker.job(a, "x", fx.offers[0]!.offerToken, undefined)?.code).to.equal(RejectCode.DRAINING);
    expect(broker.waitgroups.get("g")!.ledger.free).to.equal(1);
    expect(fx.started).to.deep.equal([]);
  });

  it("throws on slot ledger misuse instead of leaking slots", () => {
    const ledger = new SlotLedger("g", 1);
    ledger.reserve();
    expect(() => ledger.reserve()).to.throw(/without a free slot/);
    ledger.accept();
    expect(() => ledger.withdraw()).to.throw(/without an offered slot/);
    ledger.finish(5);
    expect(() => ledger.finish(5)).to.throw(/without a running slot/);
    expect(ledger.meanRuntimeMs).to.equal(5);
  });
});

describe("hand-written frames", () => {
  it("a shared Hello plus the peer's address decodes to the full Hello", () => {
    const full = create(HelloSchema, {
      instanceId: "x",
      services: { a: "g" },
      waitgroups: [create(WaitgroupStateSchema, { name: "g", processes: 3, running: 1, waiting: 7 })],
      clients: 4,
      capabilities: ["query"],
      peerAddress: "[::1]:5555",
      draining: true,
    });
    const shared = toBinary(HelloSchema, { ...full, peerAddress: "" });
    const decoded = fromBinary(ConnectResponseSchema, helloFrame(shared, "[::1]:5555"));
    expect(decoded.frame.case).to.equal("hello");
    expect(decoded.frame.value).to.deep.equal(full);
  });

  it("writes the same bytes as protobuf-es for OFFER frames", () => {
    for (const [jobId, token, wg, ms] of [
      ["j1", "tok", "g", 5000],
      ["ü".repeat(64), "A".repeat(22), "waitgroup-with-a-long-name", 250],
      ["x".repeat(200), "t", "w", 0],
      ["job", "t", "w", 3_600_000 + 1],
    ] as const) {
      const expected = toBinary(
        ConnectResponseSchema,
        create(ConnectResponseSchema, {
          frame: { case: "offer", value: create(OfferSchema, { jobId, offerToken: token, expiresIn: durationFromMs(ms), waitgroup: wg }) },
        }),
      );
      const actual = new OfferEncoder(ms).encode(jobId, token, wg);
      expect(Buffer.from(actual).toString("hex")).to.equal(Buffer.from(expected).toString("hex"));
      const decoded = fromBinary(ConnectResponseSchema, actual);
      expect(decoded.frame.case).to.equal("offer");
    }
  });
});
