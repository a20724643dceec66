// Shared by the cancel tests: an execserver whose jobs record their process groups.
import { expect } from "chai";
import { existsSync, readFileSync } from "node:fs";
import { Code, ConnectError } from "@connectrpc/connect";
import { waitFor } from "../../harness/execserver-process.js";

// Appends its process group id to $1 (one line per run), starts a grandchild in its group
// and ignores SIGTERM: only the SIGKILL after the cancel grace ends it.
const stubborn = ["sh", "-c", 'echo $$ >> "$1"; trap "" TERM; sleep 60 & wait; wait', "stubborn"];

/** The execserver every test here uses: "one" has a single slot, "two" two. */
export const cancelExecConfig = {
  instanceId: "exec-cancel",
  cancelGrace: "300ms",
  waitgroups: { one: { processes: 1 }, two: { processes: 2 } },
  services: {
    stubborn: { waitgroup: "one", command: stubborn, timeout: "1m" },
    quick: { waitgroup: "two", command: ["sh", "-c", 'echo $$ >> "$1"; sleep "$2"', "quick"], timeout: "1m" },
    marker: { waitgroup: "two", command: ["sh", "-c", 'echo ran >> "$1"', "marker"], timeout: "1m" },
    noop: { waitgroup: "two", builtin: "noop" as const },
  },
};

/** The process group ids written to a run file, once it has `n` lines. */
export async function runsOf(file: string, n = 1, timeoutMs = 15_000): Promise<number[]> {
  return waitFor(`${n} run(s) recorded in ${file}`, () => {
    if (!existsSync(file)) return undefined;
    const pids = readFileSync(file, "utf8").trim().split("\n").filter(Boolean).map(Number);
    return pids.length >= n ? pids : undefined;
  }, timeoutMs);
}

export async function expectCode(promise: Promise<unknown>, code: Code, message?: RegExp): Promise<void> {
  try {
    await promise;
  } catch (err) {
    const e = ConnectError.from(err);
    expect(Code[e.code], e.message).to.equal(Code[code]);
    if (message) expect(e.rawMessage).to.match(message);
    return;
  }
  expect.fail(`expected ${Code[code]}`);
}

