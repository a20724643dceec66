// The native job launcher (native/job-launcher.c) spoken to on the wire: the test holds the
// other end of its IPC channel as a plain socket, writes raw lines (malformed ones too) and
// answers the handle messages itself, as Node's channel would.
import { expect } from "chai";
import { execFileSync, spawn, spawnSync, type ChildProcess } from "node:child_process";
import { mkdir, mkdtemp, readdir, readFile, rm } from "node:fs/promises";
import type { Socket } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { builtNativeLauncher } from "../../support/native-launcher.js";
import { groupGone } from "../../support/process-group.js";
import { isGone } from "../../support/process-liveness.js";

interface Wire {
  readonly child: ChildProcess;
  readonly channel: Socket;
  /** The next line the launcher writes, parsed. */
  next(): Promise<Record<string, unknown>>;
  write(text: string): void;
  /** Resolves with the launcher's exit code once it exited. */
  readonly exited: Promise<number | null>;
}

function startLauncher(path: string, withReaper = false): Wire {
  // fd 3 is a socketpair like Node's IPC channel, read here as plain bytes (a handle sent
  // along is dropped by the kernel: this side never accepts it). withReaper: fd 4 stands
  // for the reaper's pipe (child.stdio[4]).
  const env = { NODE_CHANNEL_FD: "3", NODE_CHANNEL_SERIALIZATION_MODE: "json", ...(withReaper ? { SLOTBROKER_REAPER_FD: "4" } : {}) };
  const child = spawn(path, [], { stdio: ["pipe", "ignore", "inherit", "pipe", ...(withReaper ? ["pipe" as const] : [])], env });
  const channel = child.stdio[3] as Socket;
  const lines: string[] = [];
  const waiting: ((line: string) => void)[] = [];
  let buffered = "";
  channel.setEncoding("utf8");
  channel.on("data", (chunk: string) => {
    buffered += chunk;
    for (let nl = buffered.indexOf("\n"); nl >= 0; nl = buffered.indexOf("\n")) {
      const line = buffered.slice(0, nl);
      buffered = buffered.slice(nl + 1);
      const waiter = waiting.shift();
      if (waiter) waiter(line);
      else lines.push(line);
    }
  });
  channel.on("error", () => undefined);
  child.stdin!.on("error", () => undefined);
  const exited = new Promise<number | null>((resolve) => child.once("exit", (code) => resolve(code)));
  return {
    child,
    channel,
    exited,
    write: (text) => channel.write(text),
    next: () =>
      new Promise((resolve, reject) => {
        const timer = setTimeout(() => reject(new Error("the launcher did not answer")), 5000);
        const take = (line: string): void => {
          clearTimeout(timer);
          resolve(JSON.parse(line) as Record<string, unknown>);
        };
        const line = lines.shift();
        if (line !== undefined) take(line);
        else waiting.push(take);
      }),
  };
}

const spawnLine = (fields: Record<string, unknown>): string => `${JSON.stringify({ t: "spawn", args: [], cwd: "/", env: { PATH: "/usr/bin:/bin" }, ...fields })}\n`;

/** Reads the handle messages of a started job (from n = `first`), acking each; returns its pid. */
async function started(wire: Wire, id: number, first = 0): Promise<number> {
  let pid = 0;
  for (let n = first; n < 2; n++) {
    const m = await wire.next();
    expect(m).to.deep.include({ cmd: "NODE_HANDLE", type: "net.Socket" });
    expect(m.msg).to.deep.include({ t: "fd", id, n });
    pid = (m.msg as { pid: number }).pid;
    wire.write('{"cmd":"NODE_HANDLE_ACK"}\n');
  }
  return pid;
}

describe("runner: the native job launcher on the wire", function () {
  this.timeout(20_000);
  let path: string;
  let wire: Wire | undefined;
  before(function () {
    const built = builtNativeLauncher();
    if (!built) this.skip(); // no C compiler here
    path = built;
  });
  afterEach(async () => {
    wire?.child.kill("SIGKILL");
    if (wire) await wire.exited;
    wire = undefined;
  });

  it("answers --check (the execserver's test whether the binary runs here), and refuses to run without an IPC channel", () => {
    expect(execFileSync(path, ["--check"], { encoding: "utf8" })).to.equal("slotbroker-job-launcher ok protocol 5\n");
    const run = spawnSync(path, [], { encoding: "utf8", env: {} });
    expect(run.status).to.equal(2);
    expect(run.stderr).to.contain("no IPC channel (NODE_CHANNEL_FD)");
  });

  it("survives malformed lines and answers each bad request with a precise failure", async () => {
    wire = startLauncher(path);
    wire.write("not json\n");
    wire.write('{"t":"spawn","id":1,\n');
    wire.write("[1,2,3]\n");
    wire.write('{"t":"spawn","id":1,"file":"x\\u12"}\n');
    wire.write(`{"x":${"[".repeat(100_000)}${"]".repeat(100_000)}}\n`);
    wire.write('\u0000\u0001{"t":"spawn","id":1}\n');
    wire.write('{"t":"spawn","file":"true","cwd":"/"}\n'); // no id: nothing to answer to
    wire.write('{"t":"nonsense","id":1}\n');
    wire.write('{"cmd":"NODE_HANDLE_ACK"}\n'); // no handle in flight
    wire.write(spawnLine({ id: 2, file: 5 }));
    wire.write(spawnLine({ id: 3, file: "true", args: "x" }));
    wire.write(spawnLine({ id: 4, file: "true", env: { A: 1 } }));
    wire.write(spawnLine({ id: 5, file: "a\u0000b" }));
    wire.write(spawnLine({ id: 6, file: "slotbroker-no-such-command" }));
    wire.write(spawnLine({ id: 7, file: "a".repeat(9 << 20) }));
    // One byte over: the read that crosses the limit usually also holds the line's end.
    const overhead = spawnLine({ id: 8, file: "" }).length - 1;
    wire.write(spawnLine({ id: 8, file: "a".repeat((8 << 20) + 1 - overhead) }));
    expect(await wire.next()).to.deep.equal({ t: "failed", id: 2, code: "EINVAL", message: 'invalid spawn request: bad or missing field "file"' });
    expect(await wire.next()).to.deep.equal({ t: "failed", id: 3, code: "EINVAL", message: 'invalid spawn request: bad or missing field "args"' });
    expect(await wire.next()).to.deep.equal({ t: "failed", id: 4, code: "EINVAL", message: 'invalid spawn request: bad or missing field "env"' });
    expect(await wire.next()).to.deep.equal({ t: "failed", id: 5, code: "EINVAL", message: 'invalid spawn request: bad or missing field "file"' });
    expect(await wire.next()).to.deep.equal({ t: "failed", id: 6, code: "ENOENT", message: "spawn slotbroker-no-such-command ENOENT" });
    for (const id of [7, 8]) {
      expect(await wire.next()).to.deep.equal({ t: "failed", id, code: "E2BIG", message: `the spawn request is longer than ${8 << 20} bytes` });
    }
    wire.write(spawnLine({ id: 9, file: "true" }));
    await started(wire, 9);
    expect(await wire.next()).to.deep.equal({ t: "exit", id: 9, code: 0, signal: null });
  });

  it("keeps one handle in flight: the next message waits for the ack, a nack sends the handle again", async () => {
    wire = startLauncher(path);
    wire.write(spawnLine({ id: 1, file: "sh", args: ["-c", "kill -TERM $$"] }));
    const first = await wire.next();
    expect(first.msg).to.deep.include({ t: "fd", id: 1, n: 0 });
    wire.write('{"cmd":"NODE_HANDLE_NACK"}\n');
    expect(await wire.next()).to.deep.equal(first);
    // The job ends meanwhile; its exit is written only after its two handles.
    await new Promise((resolve) => setTimeout(resolve, 200));
    wire.write('{"cmd":"NODE_HANDLE_ACK"}\n');
    expect((await wire.next()).msg).to.deep.include({ t: "fd", id: 1, n: 1 });
    wire.write('{"cmd":"NODE_HANDLE_ACK"}\n');
    expect(await wire.next()).to.deep.equal({ t: "exit", id: 1, code: null, signal: "SIGTERM" });
  });

  it("passes args, env and cwd verbatim, \\u escapes and surrogate pairs included, and reports exit codes", async () => {
    const dir = await mkdtemp(join(tmpdir(), "native-launcher-"));
    try {
      wire = startLauncher(path);
      const arg = 'a "quoted" \\ é 😀 \n\t end';
      const line = spawnLine({ id: 1, file: "sh", args: ["-c", 'printf %s "$1" > arg; printf %s "$X" > env; pwd > cwd; exit 7', "sh", arg], cwd: dir, env: { PATH: "/usr/bin:/bin", X: "ü\u{1F600}" } });
      // Every non-ASCII character as a \u escape, as another JSON writer may send it.
      wire.write(line.replace(/[\u007f-\uffff]/g, (c) => `\\u${c.charCodeAt(0).toString(16).padStart(4, "0")}`));
      await started(wire, 1);
      expect(await wire.next()).to.deep.equal({ t: "exit", id: 1, code: 7, signal: null });
      expect(await readFile(join(dir, "arg"), "utf8")).to.equal(arg);
      expect(await readFile(join(dir, "env"), "utf8")).to.equal("ü\u{1F600}");
      expect((await readFile(join(dir, "cwd"), "utf8")).trim()).to.equal(dir);
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  });

  it('gives a job asked for with "stdin":false /dev/null as its stdin and passes only its stdout', async () => {
    const dir = await mkdtemp(join(tmpdir(), "native-launcher-"));
    try {
      wire = startLauncher(path);
      wire.write(spawnLine({ id: 1, file: "sh", args: ["-c", "readlink /proc/self/fd/0 > stdin; wc -c < /dev/stdin > bytes"], cwd: dir, stdin: false }));
      await started(wire, 1, 1);
      expect(await wire.next()).to.deep.equal({ t: "exit", id: 1, code: 0, signal: null });
      expect((await readFile(join(dir, "stdin"), "utf8")).trim()).to.equal("/dev/null");
      expect((await readFile(join(dir, "bytes"), "utf8")).trim()).to.equal("0");
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  });

  it('registers each job\'s group with the reaper ("+PGID") before it tells of the job, says so ("watched"), and leaves that to the execserver once the reaper is gone', async () => {
    wire = startLauncher(path, true);
    const reaper = wire.child.stdio[4] as Socket;
    let lines = "";
    reaper.setEncoding("utf8");
    reaper.on("data", (chunk: string) => (lines += chunk));
    wire.write(spawnLine({ id: 1, file: "true", stdin: false }));
    const fd = await wire.next();
    const pid = (fd.msg as { pid: number }).pid;
    expect(fd.msg).to.deep.equal({ t: "fd", id: 1, n: 1, pid, watched: true });
    wire.write('{"cmd":"NODE_HANDLE_ACK"}\n');
    expect(await wire.next()).to.deep.include({ t: "exit", id: 1, code: 0 });
    // Written before the fd message: it is here by now, whatever the order of reads here.
    await new Promise((resolve) => setImmediate(resolve));
    expect(lines).to.equal(`+${pid}\n`);
    reaper.destroy(); // the reaper died: nobody reads its pipe
    for (const id of [2, 3]) {
      wire.write(spawnLine({ id, file: "true", stdin: false }));
      const next = await wire.next();
      expect(next.msg).to.not.have.property("watched");
      wire.write('{"cmd":"NODE_HANDLE_ACK"}\n');
      expect(await wire.next()).to.deep.include({ t: "exit", id, code: 0 });
    }
  });

  it("says no job is watched when it was given no reaper", async () => {
    wire = startLauncher(path);
    wire.write(spawnLine({ id: 1, file: "true", stdin: false }));
    const fd = await wire.next();
    expect(fd.msg).to.not.have.property("watched");
  });

  it('makes the job\'s directory with "dir":true, never an existing one, and removes it again when the spawn fails', async () => {
    const root = await mkdtemp(join(tmpdir(), "native-launcher-"));
    try {
      wire = startLauncher(path);
      const cwd = (n: number): string => join(root, `job-${n}`);
      wire.write(spawnLine({ id: 1, file: "sh", args: ["-c", "stat -c %a . > ../mode"], cwd: cwd(1), dir: true, stdin: false }));
      await started(wire, 1, 1);
      expect(await wire.next()).to.deep.equal({ t: "exit", id: 1, code: 0, signal: null });
      expect((await readFile(join(root, "mode"), "utf8")).trim()).to.equal("700");
      wire.write(spawnLine({ id: 2, file: "sh", args: ["-c", "touch left"], cwd: cwd(2), dir: true, stdin: false }));
      await started(wire, 2, 1);
      expect(await wire.next()).to.deep.equal({ t: "exit", id: 2, code: 0, signal: null });
      // An existing directory is never reused; a spawn that fails removes what it made.
      wire.write(spawnLine({ id: 3, file: "true", cwd: cwd(2), dir: true }));
      expect(await wire.next()).to.deep.include({ t: "failed", id: 3, code: "EEXIST", dir: true });
      wire.write(spawnLine({ id: 4, file: "true", cwd: join(root, "gone", "job-4"), dir: true }));
      expect(await wire.next()).to.deep.include({ t: "failed", id: 4, code: "ENOENT", dir: true });
      wire.write(spawnLine({ id: 5, file: "slotbroker-no-such-command", cwd: cwd(5), dir: true }));
      expect(await wire.next()).to.deep.equal({ t: "failed", id: 5, code: "ENOENT", message: "spawn slotbroker-no-such-command ENOENT" });
      expect((await readdir(root)).sort()).to.deep.equal(["job-1", "job-2", "mode"]);
    } finally {
      await rm(root, { recursive: true, force: true });
    }
  });

  const hex = (text: string | Buffer): string => Buffer.from(text).toString("hex");

  it("reads stderr itself and sends its last non-empty line's bytes with the exit: the first 1000 of a long one, blank lines skipped, an unterminated one counted", async () => {
    wire = startLauncher(path);
    const cases: [string, string | undefined][] = [
      ["printf 'first\\nthe last word\\n\\n  \\n' >&2", "the last word"],
      ["printf 'one\\nunterminated' >&2", "unterminated"],
      ["head -c 3000 /dev/zero | tr '\\0' x >&2; echo >&2", "x".repeat(1000)],
      ["printf 'é%.0s' $(seq 600) >&2", "é".repeat(500)],
      ["i=0; while [ $i -lt 5000 ]; do echo \"noise line $i\" >&2; i=$((i+1)); done; echo 'the end' >&2", "the end"],
      ["true", undefined],
    ];
    for (const [i, [script, line]] of cases.entries()) {
      wire.write(spawnLine({ id: i + 1, file: "sh", args: ["-c", script], stdin: false }));
      await started(wire, i + 1, 1);
      const exit = await wire.next();
      expect(exit).to.deep.equal({ t: "exit", id: i + 1, code: 0, signal: null, ...(line === undefined ? {} : { err: hex(line) }) });
    }
  });

  it('reads stdout itself with "stdout":false: says "started" (no handle), and sends its first 4000 bytes and its length with the exit, or after it while stdout is held open', async () => {
    wire = startLauncher(path);
    const cases: [string, string | undefined, number][] = [
      ["printf 'some output\\n'; echo oops >&2", "some output\n", 12],
      ["head -c 70000 /dev/zero | tr '\\0' y", "y".repeat(4000), 70000],
      ["true", undefined, 0],
    ];
    for (const [i, [script, out, outn]] of cases.entries()) {
      wire.write(spawnLine({ id: i + 1, file: "sh", args: ["-c", script], stdin: false, stdout: false }));
      const start = await wire.next();
      expect(start).to.deep.equal({ t: "started", id: i + 1, pid: start.pid });
      expect(await wire.next()).to.deep.equal({ t: "exit", id: i + 1, code: 0, signal: null, ...(i === 0 ? { err: hex("oops") } : {}), ...(out === undefined ? {} : { out: hex(out), outn }) });
    }
    // With stdin, only its handle is passed.
    wire.write(spawnLine({ id: 4, file: "sh", args: ["-c", "cat"], stdout: false }));
    const m = await wire.next();
    expect(m.msg).to.deep.include({ t: "fd", id: 4, n: 0 });
    wire.write('{"cmd":"NODE_HANDLE_ACK"}\n');
    expect(await wire.next()).to.deep.include({ t: "exit", id: 4 }); // its stdin closed here: the handle was not accepted
    // A background child holds stdout: the exit comes at once, "open", the rest when it closes.
    wire.write(spawnLine({ id: 5, file: "sh", args: ["-c", "echo before; (sleep 0.3; echo after) &"], stdin: false, stdout: false }));
    await wire.next();
    expect(await wire.next()).to.deep.equal({ t: "exit", id: 5, code: 0, signal: null, out: hex("before\n"), outn: 7, open: true });
    expect(await wire.next()).to.deep.equal({ t: "stderr", id: 5, out: hex("before\nafter\n"), outn: 13 });
  });

  it('reads stdout with "stdout":"spill" while it fits 4000 bytes, and passes it on with the first 4001 once it outgrows them', async () => {
    wire = startLauncher(path);
    const fits = "head -c 4000 /dev/zero | tr '\\0' a";
    wire.write(spawnLine({ id: 1, file: "sh", args: ["-c", fits], stdin: false, stdout: "spill" }));
    expect(await wire.next()).to.deep.include({ t: "started", id: 1 });
    expect(await wire.next()).to.deep.equal({ t: "exit", id: 1, code: 0, signal: null, out: hex("a".repeat(4000)), outn: 4000 });
    // 4000 bytes, a pause, then more: the launcher reads no further than one byte over.
    wire.write(spawnLine({ id: 2, file: "sh", args: ["-c", `${fits}; sleep 0.1; printf bcd`], stdin: false, stdout: "spill" }));
    expect(await wire.next()).to.deep.include({ t: "started", id: 2 });
    const spill = await wire.next();
    expect(spill).to.deep.equal({ cmd: "NODE_HANDLE", type: "net.Socket", msg: { t: "spill", id: 2, out: hex(`${"a".repeat(4000)}b`) } });
    // Nothing else goes out while the handle waits for its ack; then the exit, without "out".
    wire.write('{"cmd":"NODE_HANDLE_ACK"}\n');
    expect(await wire.next()).to.deep.equal({ t: "exit", id: 2, code: 0, signal: null });
    // A background child spills after the exit: the spill, then the end of the pipes.
    wire.write(spawnLine({ id: 3, file: "sh", args: ["-c", `printf x; (sleep 0.2; ${fits}) &`], stdin: false, stdout: "spill" }));
    expect(await wire.next()).to.deep.include({ t: "started", id: 3 });
    expect(await wire.next()).to.deep.equal({ t: "exit", id: 3, code: 0, signal: null, out: hex("x"), outn: 1, open: true });
    expect((await wire.next()).msg).to.deep.equal({ t: "spill", id: 3, out: hex(`x${"a".repeat(4000)}`) });
    wire.write('{"cmd":"NODE_HANDLE_ACK"}\n');
    expect(await wire.next()).to.deep.equal({ t: "stderr", id: 3 });
  });

  it('writes "input" to the job\'s stdin itself and passes no stdin handle; refuses input that is not hex', async () => {
    wire = startLauncher(path);
    wire.write(spawnLine({ id: 1, file: "cat", stdout: false, input: hex("in\u0000put\n") }));
    expect(await wire.next()).to.deep.include({ t: "started", id: 1 });
    expect(await wire.next()).to.deep.equal({ t: "exit", id: 1, code: 0, signal: null, out: hex("in\u0000put\n"), outn: 7 });
    for (const [id, input] of [[2, "abc"], [3, "zz"], [4, 5]] as const) {
      wire.write(spawnLine({ id, file: "cat", stdout: false, input }));
      expect(await wire.next()).to.deep.include({ t: "failed", id, code: "EINVAL", message: 'invalid spawn request: bad or missing field "input"' });
    }
  });

  it("sends the exit at once when a background child holds stderr open, its line when stderr closes, and nothing after a drop", async () => {
    wire = startLauncher(path);
    wire.write(spawnLine({ id: 1, file: "sh", args: ["-c", "echo early >&2; (sleep 0.3; echo late >&2) &"], stdin: false }));
    await started(wire, 1, 1);
    expect(await wire.next()).to.deep.equal({ t: "exit", id: 1, code: 0, signal: null, err: hex("early"), open: true });
    expect(await wire.next()).to.deep.equal({ t: "stderr", id: 1, err: hex("late") });
    wire.write(spawnLine({ id: 2, file: "sh", args: ["-c", "echo early >&2; sleep 0.5 >&2 &"], stdin: false }));
    await started(wire, 2, 1);
    expect(await wire.next()).to.deep.equal({ t: "exit", id: 2, code: 0, signal: null, err: hex("early"), open: true });
    wire.write('{"t":"drop","id":2}\n');
    wire.write(spawnLine({ id: 3, file: "true", stdin: false }));
    await started(wire, 3, 1);
    // After 0.5 s the sleep has closed stderr: no {t:"stderr",id:2} came before id 3's exit.
    await new Promise((resolve) => setTimeout(resolve, 600));
    expect(await wire.next()).to.deep.equal({ t: "exit", id: 3, code: 0, signal: null });
  });

  it("removes directories handed to it after the spawn they came with, or alone, and reports those it left", async () => {
    const root = await mkdtemp(join(tmpdir(), "native-launcher-"));
    try {
      wire = startLauncher(path);
      const dir = (name: string): string => join(root, name);
      await mkdir(dir("a"));
      await mkdir(dir("b"));
      await mkdir(join(dir("full"), "x"), { recursive: true });
      wire.write(spawnLine({ id: 1, file: "true", stdin: false, rm: [dir("a"), dir("full"), dir("gone"), 5], rmn: 1 }));
      // The job's handle first: the removals come after the spawn, in a thread of their own.
      await started(wire, 1, 1);
      const answers = [await wire.next(), await wire.next()].sort((x, y) => String(x.t).localeCompare(String(y.t)));
      expect(answers[0]).to.deep.include({ t: "exit", id: 1, code: 0, signal: null });
      expect(answers[1]).to.deep.equal({ t: "rm", rmn: 1, left: [dir("full")] });
      wire.write(`${JSON.stringify({ t: "rm", rm: [dir("b")], rmn: 2 })}\n`);
      expect(await wire.next()).to.deep.equal({ t: "rm", rmn: 2, left: [] });
      expect(await readdir(root)).to.deep.equal(["full"]);
    } finally {
      await rm(root, { recursive: true, force: true });
    }
  });

  for (const gone of ["stdin", "channel"] as const)
    it(`kills every running job's process group and exits when its ${gone} closes (the execserver is gone)`, async () => {
      wire = startLauncher(path);
      wire.write(spawnLine({ id: 1, file: "sh", args: ["-c", "sleep 30 & sleep 30"] }));
      const pid = await started(wire, 1);
      if (gone === "stdin") wire.child.stdin!.end();
      else wire.channel.destroy();
      expect(await wire.exited).to.equal(0);
      expect(await groupGone(pid)).to.equal(true);
      expect(await isGone(pid)).to.equal(true);
    });
});
