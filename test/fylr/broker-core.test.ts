import { expect } from "chai";
import { create, fromBinary } from "@bufbuild/protobuf";
import {
  ConnectRequestSchema,
  DeclineSchema,
  JobSchema,
  JobSpecSchema,
  QuerySchema,
  type ConnectRequest,
  CancelSchema,
} from "../../gen/slotbroker/v1/broker_pb.js";
import { encodeCancel, encodeDecline, encodeJob, encodeQuery, encodeUnwant, encodeWant, encodeWithSchema } from "../../src/fylr/broker/frames.js";
import {
  RaceBook,
  WantRace,
  canTransition,
  checkTransition,
  compileBrokerConfig,
  decideGrowth,
  ipFromBytes,
  isCovered,
  type GrowthInput,
  type GrowthPolicy,
} from "../../src/fylr/broker/index.js";
import { ConfigError } from "../../src/shared/errors.js";
import { retryDelayMs } from "../../src/shared/retry.js";

const policy: GrowthPolicy = { retryTickMs: 1000, growIntervalMs: 2000, maxConnections: 3, reprobeMs: 60_000 };
const base: GrowthInput = { now: 100_000, oldestParkedAt: 98_000, connections: 1, pending: 0, lastGrowthAt: undefined, coveredAt: undefined };

describe("fylr broker core (pure)", () => {
  describe("pool growth decision", () => {
    it("grows when a want has been parked for a whole retry tick", () => {
      expect(decideGrowth(base, policy)).to.deep.equal({ grow: true });
      expect(decideGrowth({ ...base, oldestParkedAt: 99_000 }, policy)).to.deep.equal({ grow: true });
    });

    it("does not grow without backpressure", () => {
      expect(decideGrowth({ ...base, oldestParkedAt: undefined }, policy)).to.deep.equal({ grow: false, reason: "no-backpressure" });
      expect(decideGrowth({ ...base, oldestParkedAt: 99_500 }, policy)).to.deep.equal({ grow: false, reason: "no-backpressure" });
    });

    it("opens at most one connection per grow interval", () => {
      expect(decideGrowth({ ...base, lastGrowthAt: 99_000 }, policy)).to.deep.equal({ grow: false, reason: "rate-limited" });
      expect(decideGrowth({ ...base, lastGrowthAt: 98_000 }, policy)).to.deep.equal({ grow: true });
    });

    it("waits for the previous new connection's HELLO", () => {
      expect(decideGrowth({ ...base, pending: 1 }, policy)).to.deep.equal({ grow: false, reason: "pending" });
    });

    it("stops at the cap", () => {
      expect(decideGrowth({ ...base, connections: 3 }, policy)).to.deep.equal({ grow: false, reason: "at-cap" });
    });

    it("stops while covered and probes again once the mark lapses", () => {
      expect(decideGrowth({ ...base, coveredAt: 50_000 }, policy)).to.deep.equal({ grow: false, reason: "covered" });
      expect(isCovered({ now: 100_000, coveredAt: 50_000 }, policy)).to.equal(true);
      expect(isCovered({ now: 110_000, coveredAt: 50_000 }, policy)).to.equal(false);
      expect(decideGrowth({ ...base, now: 110_000, oldestParkedAt: 108_000, coveredAt: 50_000 }, policy)).to.deep.equal({ grow: true });
    });
  });

  describe("acquire race bookkeeping", () => {
    it("lets the first offer win and names the others to UNWANT", () => {
      const race = new WantRace<string>("j1", "cat", 0, 0);
      expect(race.park("a")).to.equal(true);
      expect(race.park("b")).to.equal(true);
      expect(race.park("c")).to.equal(true);
      expect(race.park("a"), "no double park on one connection").to.equal(false);
      expect(race.offer("b")).to.deep.equal({ accept: true, unwant: ["a", "c"] });
      expect(race.state).to.equal("won");
      expect(race.wonOn).to.equal("b");
    });

    it("declines every later offer, and offers after giving up", () => {
      const race = new WantRace<string>("j1", "cat", 0, 0);
      race.park("a");
      race.park("b");
      race.offer("a");
      expect(race.offer("b")).to.deep.equal({ accept: false });
      expect(race.park("c"), "a won race parks nowhere").to.equal(false);
      const gone = new WantRace<string>("j2", "cat", 0, 0);
      gone.park("a");
      expect(gone.end()).to.deep.equal(["a"]);
      expect(gone.end()).to.deep.equal([]);
      expect(gone.offer("a")).to.deep.equal({ accept: false });
      expect(gone.state).to.equal("ended");
    });

    it("accepts an offer from a connection it was unparked from (an offer is an offer)", () => {
      const race = new WantRace<string>("j1", "cat", 0, 0);
      race.park("a");
      race.unpark("a");
      expect(race.offer("a")).to.deep.equal({ accept: true, unwant: [] });
    });

    it("indexes parked races by service for a newly reached instance", () => {
      const book = new RaceBook<string>();
      const a = new WantRace<string>("a", "cat", 0, 0);
      const b = new WantRace<string>("b", "ffmpeg", 0, 0);
      const c = new WantRace<string>("c", "cat", 5, 0);
      book.add(a);
      book.add(b);
      book.add(c);
      expect(() => book.add(new WantRace<string>("a", "cat", 0, 0))).to.throw(/duplicate job id a/);
      expect([...book.forService("cat")].map((r) => r.jobId)).to.deep.equal(["a", "c"]);
      book.delete(a);
      expect([...book.forService("cat")].map((r) => r.jobId)).to.deep.equal(["c"]);
      expect([...book.forService("sox")]).to.deep.equal([]);
      expect(book.get("b")).to.equal(b);
      expect(book.size).to.equal(2);
    });
  });

  describe("connection lifecycle", () => {
    it("allows only the documented transitions", () => {
      expect(canTransition("idle", "connecting")).to.equal(true);
      expect(canTransition("connecting", "ready")).to.equal(true);
      expect(canTransition("ready", "backoff")).to.equal(true);
      expect(canTransition("backoff", "connecting")).to.equal(true);
      expect(canTransition("ready", "connecting")).to.equal(false);
      expect(() => checkTransition("closed", "connecting")).to.throw(/illegal broker connection transition closed → connecting/);
    });

    it("backs off exponentially, capped, with jitter below the nominal delay", () => {
      const p = { initialMs: 100, maxMs: 1000, multiplier: 2, jitter: 0.5 };
      expect([0, 1, 2, 3, 4, 10].map((n) => retryDelayMs(p, n, () => 0))).to.deep.equal([100, 200, 400, 800, 1000, 1000]);
      expect(retryDelayMs(p, 1, () => 1)).to.equal(100);
      expect(retryDelayMs(p, 1000, () => 0)).to.equal(1000);
    });
  });

  describe("local address helpers", () => {
    it("renders IPv4, IPv6 and IPv4-mapped addresses from channelz bytes", () => {
      expect(ipFromBytes(Uint8Array.from([127, 0, 0, 1]))).to.equal("127.0.0.1");
      const v6 = new Uint8Array(16);
      v6[15] = 1;
      expect(ipFromBytes(v6)).to.equal("::1");
      const mapped = Uint8Array.from([0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 1, 2, 3]);
      expect(ipFromBytes(mapped)).to.equal("10.1.2.3");
      const doc = Uint8Array.from([0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 1]);
      expect(ipFromBytes(doc)).to.equal("2001:db8::1:0:0:1");
      expect(ipFromBytes(new Uint8Array(3))).to.equal(undefined);
    });
  });

  describe("hand-encoded frames", () => {
    it("encode WANT, UNWANT, JOB, DECLINE and QUERY exactly like protobuf-es", () => {
      const ids = ["j1", "x".repeat(127), "y".repeat(300), "jöb-ü€"];
      const priorities = [0, 1, 127, 128, 300, 2 ** 31 - 1, -1, -(2 ** 31)];
      for (const jobId of ids) {
        for (const priority of priorities) {
          const want = create(ConnectRequestSchema, { frame: { case: "want", value: { jobId, service: "ffmpeg-ü", priority } } });
          expect(Buffer.from(encodeWithSchema(want)).equals(encodeWant(jobId, "ffmpeg-ü", priority)), `${jobId} ${priority}`).to.equal(true);
        }
        for (const [fairnessKey, fairnessWeight] of [["tenant-ü", 0], ["", 3], ["k".repeat(128), 1000], ["t", 2 ** 32 - 1]] as const) {
          const keyed = create(ConnectRequestSchema, { frame: { case: "want", value: { jobId, service: "s", priority: 2, fairnessKey, fairnessWeight } } });
          expect(Buffer.from(encodeWithSchema(keyed)).equals(encodeWant(jobId, "s", 2, fairnessKey, fairnessWeight)), `${jobId} ${fairnessKey}`).to.equal(true);
        }
        const unwant = create(ConnectRequestSchema, { frame: { case: "unwant", value: { jobId } } });
        expect(Buffer.from(encodeWithSchema(unwant)).equals(encodeUnwant(jobId))).to.equal(true);
        const frames: [ConnectRequest["frame"], Buffer][] = [
          [{ case: "decline", value: create(DeclineSchema, { jobId, offerToken: "tök" }) }, encodeDecline(jobId, "tök")],
          [{ case: "decline", value: create(DeclineSchema, { jobId }) }, encodeDecline(jobId, "")],
          [{ case: "query", value: create(QuerySchema, { jobId }) }, encodeQuery(jobId)],
          [{ case: "cancel", value: create(CancelSchema, { jobId }) }, encodeCancel(jobId)],
        ];
        const specs = [
          create(JobSpecSchema, {}),
          create(JobSpecSchema, {
            args: ["-c", "x".repeat(200)],
            env: { A: "1" },
            timeout: { seconds: 3n, nanos: 5 },
            stdinUrl: "http://127.0.0.1:1/pipe/in/x",
            stdoutUrl: "http://127.0.0.1:1/pipe/out/y",
            labels: { k: "v" },
          }),
          create(JobSpecSchema, { args: [""], stdoutUrl: "http://127.0.0.1:1/pipe/out/y", stdinInline: Buffer.from("abc") }),
          create(JobSpecSchema, { timeout: { seconds: 1n, nanos: 0 }, stdinInline: new Uint8Array(65_536).fill(255) }),
        ];
        for (const spec of specs) {
          frames.push([{ case: "job", value: create(JobSchema, { jobId, offerToken: "T", spec }) }, encodeJob(jobId, "T", spec)]);
        }
        const traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
        frames.push([{ case: "job", value: create(JobSchema, { jobId, offerToken: "T", spec: specs[0], traceparent }) }, encodeJob(jobId, "T", specs[0]!, traceparent)]);
        for (const [frame, bytes] of frames) {
          expect(Buffer.from(encodeWithSchema(create(ConnectRequestSchema, { frame }))).equals(bytes), frame.case).to.equal(true);
        }
        const decoded = fromBinary(ConnectRequestSchema, encodeWant(jobId, "s", -5));
        expect(decoded.frame.case === "want" && decoded.frame.value).to.include({ jobId, service: "s", priority: -5 });
      }
    });
  });

  describe("config", () => {
    it("compiles durations and defaults", () => {
      const config = compileBrokerConfig({ addresses: ["127.0.0.1:7600"], connectTimeout: "5s", clientName: "f1" });
      expect(config.connectTimeoutMs).to.equal(5000);
      expect(config.growth).to.deep.equal({ retryTickMs: 1000, growIntervalMs: 2000, maxConnections: 8, reprobeMs: 60_000 });
      expect(config.clientName).to.equal("f1");
      expect(config.timings.backoff.initialMs).to.equal(100);
    });

    it("names the bad key", () => {
      expect(() => compileBrokerConfig({ addresses: [] }, "fylr.yaml")).to.throw(ConfigError, /addresses: name at least one/);
      expect(() => compileBrokerConfig({ addresses: ["x:1"], retryTick: "1" }, "fylr.yaml")).to.throw(/retryTick: expected a duration/);
      expect(() => compileBrokerConfig({ addresses: ["x:1"], reconnectInitial: "5s", reconnectMax: "1s" })).to.throw(/reconnectMax/);
      expect(() => compileBrokerConfig({ addresses: ["x:1", "x:1"] })).to.throw(/addresses: listed twice/);
    });
  });
});
