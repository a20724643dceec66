// The argv of `slotbroker submit` (pure) and its progress lines.
import { expect } from "chai";
import { create } from "@bufbuild/protobuf";
import { ItemSchema, ItemState, QueuePositionSchema, WatchResponseSchema } from "../../gen/slotbroker/v1/queue_pb.js";
import { parseSubmitArgs, withStdin } from "../../src/commands/submit-args.js";
import { progressLine } from "../../src/commands/submit-progress.js";
import { durationMs } from "@bufbuild/protobuf/wkt";

describe("slotbroker submit arguments", () => {
  it("builds a chain: flags belong to the call they follow, --then reads the previous stdout", () => {
    const plan = parseSubmitArgs(["--service", "cat", "--stdin", "in.txt", "--then", "gzip", "--arg=-9", "--then", "base64", "--arg=-w0", "--env", "LC_ALL=C", "--timeout", "30s", "--priority", "5", "--wait"]);
    expect(plan.stdinPath).to.equal("in.txt");
    expect(plan.wait).to.equal(true);
    const calls = plan.request.calls.map((c) => [c.service, c.args, c.stdin.case ?? "none", { ...c.env }, c.timeout && durationMs(c.timeout)]);
    expect(calls).to.deep.equal([
      ["cat", [], "none", {}, undefined],
      ["gzip", ["-9"], "stdinFromPrevious", {}, undefined],
      ["base64", ["-w0"], "stdinFromPrevious", { LC_ALL: "C" }, 30_000],
    ]);
    expect(plan.request.priority).to.equal(5);
    const request = withStdin(plan.request, Buffer.from("x"));
    expect(request.calls[0]!.stdin).to.deep.equal({ case: "stdinData", value: Buffer.from("x") });
  });

  it("builds a local action with params, and item options", () => {
    const now = new Date("2030-01-01T00:00:00Z");
    const plan = parseSubmitArgs(["--local", "checksum", "--param", "algorithm=md5", "--idempotency-key", "k1", "--max-attempts", "2", "--start-after", "5m", "--api", "http://h:1"], now);
    expect(plan.request.local?.name).to.equal("checksum");
    expect(plan.request.local?.params).to.deep.equal({ algorithm: "md5" });
    expect(plan.request.idempotencyKey).to.equal("k1");
    expect(plan.request.maxAttempts).to.equal(2);
    expect(Number(plan.request.startAfter!.seconds) * 1000).to.equal(now.getTime() + 5 * 60_000);
    expect(plan.api).to.equal("http://h:1");
    expect(withStdin(plan.request, Buffer.from("in")).local!.input).to.deep.equal(Buffer.from("in"));
  });

  it("takes a fairness key, its weight and its limit", () => {
    const plan = parseSubmitArgs(["--service", "cat", "--fairness-key", "tenant-1", "--weight", "3", "--key-limit", "2"]);
    expect([plan.request.fairnessKey, plan.request.fairnessWeight, plan.request.fairnessLimit]).to.deep.equal(["tenant-1", 3, 2]);
    expect(() => parseSubmitArgs(["--service", "cat", "--weight", "0"])).to.throw(/--weight/);
    expect(() => parseSubmitArgs(["--service", "cat", "--key-limit", "x"])).to.throw(/--key-limit/);
  });

  it("names the flag that is wrong", () => {
    const cases: [string[], RegExp][] = [
      [[], /give --service SERVICE/],
      [["--arg", "x"], /--arg x: give --service first/],
      [["--then", "gzip"], /--then: give the first call with --service/],
      [["--service", "a", "--service", "b"], /--service: given twice; chain another call with --then/],
      [["--service", "a", "--local", "checksum"], /--local: give either --service or --local/],
      [["--service", "a", "--then", "b", "--stdin", "f"], /--stdin: only the first call reads it/],
      [["--service", "a", "--env", "NOVALUE"], /--env NOVALUE: expected NAME=VALUE/],
      [["--service", "a", "--timeout", "30"], /--timeout 30: expected a duration with a unit/],
      [["--service", "a", "--priority", "high"], /--priority high: expected an integer/],
      [["--service", "a", "--start-after", "tomorrow"], /--start-after tomorrow: /],
      [["--service", "a", "--param", "k=v"], /--param k=v: only for a --local action/],
      [["--local", "checksum", "--stdin-url", "http://x/"], /--stdin-url: a local action takes its input from --stdin/],
      [["--service", "a", "--bogus"], /Unknown option '--bogus'/],
    ];
    for (const [argv, message] of cases) expect(() => parseSubmitArgs(argv), argv.join(" ")).to.throw(message);
  });

  it("shows state, attempt and the line while waiting", () => {
    const update = (state: ItemState, summary: string, attempts = 1) =>
      create(WatchResponseSchema, { item: create(ItemSchema, { state, attempts, maxAttempts: 3 }), position: create(QueuePositionSchema, { summary }) });
    expect(progressLine(update(ItemState.QUEUED, "3 running, 7 waiting - you are number 11, about 40s"))).to.equal("queued: 3 running, 7 waiting - you are number 11, about 40s");
    expect(progressLine(update(ItemState.RUNNING, "running sha256sum on exec-1", 2))).to.equal("running sha256sum on exec-1 (attempt 2 of 3)");
    expect(progressLine(update(ItemState.SUCCEEDED, "succeeded"))).to.equal("succeeded");
  });
});
