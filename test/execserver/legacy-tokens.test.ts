import { expect } from "chai";
import type { ConnectResponse } from "../../gen/slotbroker/v1/broker_pb.js";
import { BrokerCore, ClientConnection, type CoreEffects, type JobRecord } from "../../src/execserver/broker-core.js";
import { compileExecserverConfig } from "../../src/execserver/config.js";
import { IdleGaps } from "../../src/execserver/idle-gaps.js";
import { LegacyToken, LegacyTokens } from "../../src/execserver/legacy/index.js";

// The token table on top of the broker core, with a hand-cranked clock: legacy tokens and
// broker offers share one ledger, and a token never jumps a parked want.
function setup(processes = 1): {
  broker: BrokerCore;
  tokens: LegacyTokens;
  clock: { now: number };
  offers: string[];
  conn: (id: string) => ClientConnection;
} {
  const config = compileExecserverConfig(
    { waitgroups: { g: { processes }, h: { processes: 1 } }, services: { s: { waitgroup: "g", builtin: "noop" }, t: { waitgroup: "h", builtin: "noop" } } },
    "t",
  );
  const clock = { now: 0 };
  const offers: string[] = [];
  const fx: CoreEffects = {
    offered: (record: JobRecord) => offers.push(record.jobId),
    offerEnded: () => undefined,
    start: () => undefined,
    cancel: () => undefined,
  };
  const broker = new BrokerCore({ ...config, offerTimeoutMs: 1000, now: () => clock.now }, fx);
  const tokens = new LegacyTokens(broker, { ttlMs: 10_000, now: () => clock.now });
  const sink = { send: (_frame: ConnectResponse | Uint8Array) => undefined };
  const conn = (id: string): ClientConnection => {
    const c = new ClientConnection(id, "127.0.0.1:1", "", new Date(), sink);
    broker.connect(c);
    return c;
  };
  return { broker, tokens, clock, offers, conn };
}

function issued(result: ReturnType<LegacyTokens["issue"]>): LegacyToken {
  if (!(result instanceof LegacyToken)) throw new Error(`expected a token, got ${JSON.stringify(result)}`);
  return result;
}

describe("Legacy tokens (core)", () => {
  it("reserves a slot of the shared ledger, so a broker want parks until the token's job is done", () => {
    const { broker, tokens, offers, conn } = setup(1);
    const token = issued(tokens.issue("s"));
    const group = broker.waitgroups.get("g")!;
    expect(group.ledger.offered).to.equal(1);
    expect(tokens.countsOf(group).tokens).to.equal(1);
    broker.want(conn("a"), "a1", "s", 0);
    expect(offers).to.deep.equal([]);
    expect(tokens.redeem(token.token)).to.equal(token);
    tokens.start(token);
    expect(group.ledger.running).to.equal(1);
    expect(broker.running).to.equal(1);
    tokens.finish(token, 5);
    expect(offers).to.deep.equal(["a1"]);
    expect(broker.running).to.equal(0);
    expect(tokens.countsOf(group)).to.deep.equal({ tokens: 0, running: 0, done: 1 });
  });

  it("refuses a token with 'wants-parked' while any want of the waitgroup is parked, and issues one once the book is empty", () => {
    const { broker, tokens, conn } = setup(1);
    const a = conn("a");
    broker.want(a, "a1", "s", 0); // takes the only slot (offered)
    broker.want(a, "a2", "s", 0); // parked
    expect(tokens.issue("s")).to.include({ refused: "wants-parked" });
    // Another waitgroup with an empty book is not affected.
    expect(tokens.issue("t")).to.be.instanceOf(LegacyToken);
    broker.unwant(a, "a2");
    expect(tokens.issue("s")).to.include({ refused: "no-slot" });
    broker.unwant(a, "a1");
    expect(tokens.issue("s")).to.be.instanceOf(LegacyToken);
    expect(tokens.totals.refused).to.deep.include({ "wants-parked": 1, "no-slot": 1 });
  });

  it("names the parked wants, not the busy slots, when both would refuse", () => {
    const { broker, tokens, conn } = setup(2);
    const a = conn("a");
    broker.want(a, "a1", "s", 0);
    broker.want(a, "a2", "s", 0);
    broker.want(a, "a3", "s", 0); // parked: both slots offered
    broker.unwant(a, "a1"); // frees one slot, which goes straight to a3
    expect(broker.waitgroups.get("g")!.book.size).to.equal(0);
    broker.want(a, "a4", "s", 0);
    const refusal = tokens.issue("s");
    expect(refusal).to.include({ refused: "wants-parked" });
    expect((refusal as { message: string }).message).to.match(/1 broker want\(s\) of waitgroup g are parked/);
  });

  it("expires an unredeemed token after its TTL and hands the slot to the next parked want", () => {
    const { broker, tokens, clock, offers, conn } = setup(1);
    const token = issued(tokens.issue("s"));
    broker.want(conn("a"), "a1", "s", 0);
    clock.now = 9_999;
    expect(tokens.expireDue()).to.equal(0);
    expect(tokens.nextExpiry()).to.equal(10_000);
    clock.now = 10_000;
    expect(tokens.expireDue()).to.equal(1);
    expect(offers).to.deep.equal(["a1"]);
    expect(token.state).to.equal("expired");
    expect(tokens.redeem(token.token)).to.equal(undefined);
    expect(tokens.totals).to.include({ expired: 1, notFound: 1 });
  });

  it("redeems a token once: a second PUT with it is 'not found'", () => {
    const { tokens } = setup(1);
    const token = issued(tokens.issue("s"));
    expect(tokens.redeem(token.token)).to.equal(token);
    expect(tokens.redeem(token.token)).to.equal(undefined);
    expect(tokens.redeem("never-issued")).to.equal(undefined);
    expect(tokens.totals.notFound).to.equal(2);
  });

  it("gives the slot back at once on release and on an abandoned redeem", () => {
    const { broker, tokens, offers, conn } = setup(1);
    const first = issued(tokens.issue("s"));
    broker.want(conn("a"), "a1", "s", 0);
    expect(tokens.release(first.token)).to.equal(true);
    expect(tokens.release(first.token)).to.equal(false);
    expect(offers).to.deep.equal(["a1"]);
    const group = broker.waitgroups.get("g")!;
    broker.decline(broker.connections.get("a")!, "a1", broker.connections.get("a")!.jobs.get("a1")!.offerToken);
    const second = issued(tokens.issue("s"));
    tokens.redeem(second.token);
    tokens.abandon(second);
    expect(group.ledger.free).to.equal(1);
  });

  it("refuses unknown services and everything while draining", () => {
    const { broker, tokens } = setup(1);
    expect(tokens.issue("nope")).to.include({ refused: "unknown-service" });
    broker.drain();
    expect(tokens.issue("s")).to.include({ refused: "draining" });
  });

  it("expires many tokens in issue order with one list (no scan)", () => {
    const { tokens, clock } = setup(50);
    const all: LegacyToken[] = [];
    for (let i = 0; i < 50; i++) {
      clock.now = i;
      all.push(issued(tokens.issue("s")));
    }
    tokens.release(all[10]!.token);
    tokens.redeem(all[20]!.token);
    clock.now = 10_025;
    expect(tokens.expireDue()).to.equal(24); // 0..25 minus the released and the redeemed
    expect(tokens.outstanding).to.equal(24);
    expect(tokens.nextExpiry()).to.equal(10_026);
  });
});

describe("IdleGaps", () => {
  it("matches frees and starts oldest first and ignores starts with no freed slot", () => {
    const gaps = new IdleGaps(2);
    expect(gaps.taken(5)).to.equal(undefined);
    gaps.freed(10);
    gaps.freed(20);
    expect(gaps.taken(25)).to.equal(15);
    expect(gaps.taken(26)).to.equal(6);
    expect(gaps.taken(27)).to.equal(undefined);
  });

  it("keeps at most one entry per slot and does not report gaps nobody waited for", () => {
    const gaps = new IdleGaps(2, 1000);
    gaps.freed(0);
    gaps.freed(1);
    gaps.freed(2); // three frees, two slots: the oldest is dropped
    expect(gaps.taken(3)).to.equal(2);
    expect(gaps.taken(5000)).to.equal(undefined);
  });
});
