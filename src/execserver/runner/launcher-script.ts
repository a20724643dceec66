/**
 * The Node job launcher's program, used where the native launcher (native/job-launcher.c,
 * which speaks the same protocol) is not built: plain CommonJS run by `node -e`, without
 * the execserver's loaders, flags or NODE_OPTIONS, so it stays a small process (about 50 MB
 * RSS against the execserver's 100+ MB). Forking copies the forking process's page tables, and Node's
 * spawn() blocks until the child has exec'd; done here, that cost is the launcher's, and
 * the execserver's event loop keeps serving other jobs meanwhile.
 *
 * Protocol over the IPC channel (JSON):
 * - in:  {t:"spawn", id, file, args, cwd, env, stdin, stdout?, dir?, rm?, rmn?}
 * - out: {t:"fd", id, n, pid, watched?} with the job's stdin (n=0) and stdout (n=1) as the
 *        passed handle, so the execserver reads and writes those pipes itself; with stdin:
 *        false the job reads /dev/null and only n=1 comes (a passed handle costs a message,
 *        its ack and a socket on either side); with stdout: false stdout is read here
 *        (below) and n=1 does not come; when no handle comes at all, {t:"started", id, pid,
 *        watched?} does. watched: true says the job's process group is registered with
 *        the reaper already (the native launcher, given the reaper's pipe; never here)
 * - stdout read here (stdout: false): its first STDOUT_BUFFER_LIMIT bytes are kept and all
 *        counted, sent as "out" (hex; absent: none) and "outn" (the count) where "err" goes
 * - stdout: "spill" (read here until it outgrows STDOUT_BUFFER_LIMIT, then passed on with
 *        the bytes read: {t:"spill", id, out} and the handle) and input (the job's stdin,
 *        hex, written here) are the native launcher's alone; this one is never asked them
 *        (JobLauncherOptions.nativeProtocol)
 * - stderr stays here: the launcher reads it and keeps its last non-empty line as
 *        LastLineTracker does (stderr-line.ts; at most STDERR_LINE_LIMIT bytes, the first
 *        ones of a longer line), sent as "err", the line's raw bytes in hex (absent: none);
 *        the execserver trims it and cuts a partial character
 * - out: {t:"exit", id, code, signal, err?, out?, outn?, rmn?} once the job is reaped and
 *        its pipes read here are read to their end; when another process (a background
 *        child) still holds one open at the reap: {t:"exit", ..., open: true, rmn?} at
 *        once (err, out: what came so far), then {t:"stderr", id, err?, out?, outn?} when
 *        they close; in: {t:"drop", id} stops reading them (the execserver gave up on the
 *        job's pipes), and no {t:"stderr"} comes
 * - with dir: true in the spawn, the launcher makes cwd (mode 0700) before the job. A
 *        failed mkdir is answered {t:"failed", id, code, message, dir: true}; a failed spawn
 *        removes the directory again.
 * - rm: [paths] with rmn: N (the batch's number, increasing), in a spawn (removed after
 *        that spawn is handled) or alone as {t:"rm", rm, rmn}: finished jobs' directories,
 *        each removed here by rmdir (one already gone counts as removed), off the main
 *        loop, batch after batch. Once a batch is done, every exit carries rmn: the last
 *        batch done by then. out: {t:"rm", rmn, left: [paths]} after a batch that left
 *        directories (not empty, or any other error: the execserver removes them), and
 *        after every batch sent alone, left or not.
 * - out: {t:"failed", id, code, message} when the job could not be started.
 * When its stdin or the channel closes (the execserver exited or died), every job not yet
 * reaped here is SIGKILLed by process group and the launcher exits.
 */
export const LAUNCHER_SCRIPT = String.raw`// slotbroker job launcher
"use strict";
const { spawn } = require("node:child_process");
const { mkdirSync, rmdir, rmdirSync } = require("node:fs");
process.title = "slotbroker-job-launcher";
const running = new Map();
const send = (message, handle) => { if (process.connected) process.send(message, handle, () => {}); };
for (const sig of ["SIGINT", "SIGTERM", "SIGHUP"]) process.on(sig, () => {});
const LIMIT = 1000; // STDERR_LINE_LIMIT
const OUT_LIMIT = 4000; // STDOUT_BUFFER_LIMIT
// stdout read here: its first OUT_LIMIT bytes and how many in all.
function keeper() {
  let kept = null, keptLen = 0, total = 0;
  return {
    push(chunk) {
      if (!kept) kept = Buffer.alloc(OUT_LIMIT);
      if (keptLen < OUT_LIMIT) keptLen += chunk.copy(kept, keptLen, 0, Math.min(chunk.length, OUT_LIMIT - keptLen));
      total += chunk.length;
    },
    fields() { return total === 0 ? {} : { out: kept.toString("hex", 0, keptLen), outn: total }; },
  };
}
// stderr's last non-empty line, as LastLineTracker keeps it: the raw bytes, hex.
function tracker() {
  let cur = null, curLen = 0, last = null, lastLen = 0;
  const blank = (b, n) => { for (let i = 0; i < n; i++) { const c = b[i]; if (c !== 0x20 && (c < 0x09 || c > 0x0d)) return false; } return true; };
  return {
    push(chunk) {
      if (!cur) { cur = Buffer.alloc(LIMIT); last = Buffer.alloc(LIMIT); }
      let start = 0;
      for (;;) {
        const nl = chunk.indexOf(0x0a, start);
        const end = nl === -1 ? chunk.length : nl;
        if (curLen < LIMIT && end > start) curLen += chunk.copy(cur, curLen, start, Math.min(end, start + LIMIT - curLen));
        if (nl === -1) return;
        if (!blank(cur, curLen)) { [last, cur] = [cur, last]; lastLen = curLen; }
        curLen = 0;
        start = nl + 1;
      }
    },
    hex() {
      if (!cur) return undefined;
      const [b, n] = blank(cur, curLen) ? [last, lastLen] : [cur, curLen];
      return n > 0 ? b.toString("hex", 0, n) : undefined;
    },
  };
}
const stderrs = new Map();
// Batches of removals run one after the other on libuv's threads (rmdir can block for long).
let rmDone;
let removing = Promise.resolve();
const rmdirLeft = (p) => new Promise((resolve) => rmdir(p, (err) => resolve(err && err.code !== "ENOENT" ? p : undefined)));
function removeDirs(paths, rmn, always) {
  if (!Array.isArray(paths) || typeof rmn !== "number") return;
  removing = removing.then(async () => {
    const left = (await Promise.all(paths.filter((p) => typeof p === "string").map(rmdirLeft))).filter((p) => p !== undefined);
    rmDone = rmn;
    if (left.length > 0 || always) send({ t: "rm", rmn, left });
  });
}
process.on("message", (m) => {
  if (!m) return;
  if (m.t === "rm") return removeDirs(m.rm, m.rmn, true);
  if (m.t === "drop") {
    const streams = stderrs.get(m.id);
    if (streams) { stderrs.delete(m.id); for (const s of streams) s.destroy(); }
    return;
  }
  if (m.t !== "spawn") return;
  spawnJob(m);
  if (m.rm !== undefined) removeDirs(m.rm, m.rmn, false);
});
function spawnJob(m) {
  if (m.dir === true) {
    try {
      mkdirSync(m.cwd, { mode: 0o700 });
    } catch (err) {
      send({ t: "failed", id: m.id, code: err.code, message: "cannot create the working directory " + m.cwd + ": " + err.message, dir: true });
      return;
    }
  }
  const unmake = () => { if (m.dir === true) try { rmdirSync(m.cwd); } catch {} };
  let child;
  try {
    child = spawn(m.file, m.args, { cwd: m.cwd, env: m.env, detached: true, stdio: [m.stdin === false ? "ignore" : "pipe", "pipe", "pipe"] });
  } catch (err) {
    unmake();
    send({ t: "failed", id: m.id, code: err.code, message: err.message });
    return;
  }
  if (child.pid === undefined) {
    unmake();
    child.once("error", (err) => send({ t: "failed", id: m.id, code: err.code, message: err.message }));
    for (const s of child.stdio) if (s) s.destroy();
    return;
  }
  child.on("error", () => {});
  // stdin and stdout (unless read here) now belong to the execserver: take them from the
  // ChildProcess (which would close stdin at exit) and never read them here. stderr is read here.
  const readOut = m.stdout === false;
  const streams = [child.stdin, readOut ? null : child.stdout];
  const here = readOut ? [child.stderr, child.stdout] : [child.stderr];
  child.stdin = null;
  child.stdio[0] = null;
  if (!readOut) {
    child.stdout = null;
    child.stdio[1] = null;
    streams[1]._handle.readStop();
  }
  const line = tracker();
  const out = keeper();
  let open = here.length;
  let exitSent = false;
  here[0].on("data", (chunk) => line.push(chunk));
  if (readOut) here[1].on("data", (chunk) => out.push(chunk));
  for (const s of here) {
    s.on("error", () => {});
    s.once("close", () => {
      if (--open === 0 && exitSent && stderrs.delete(m.id)) send({ t: "stderr", id: m.id, err: line.hex(), ...out.fields() });
    });
  }
  running.set(m.id, child.pid);
  streams.forEach((s, n) => { if (s) send({ t: "fd", id: m.id, n, pid: child.pid }, s); });
  if (!streams[0] && !streams[1]) send({ t: "started", id: m.id, pid: child.pid });
  child.once("exit", (code, signal) => {
    running.delete(m.id);
    // What the job wrote before it exited is read within this turn of the loop or the next.
    setImmediate(() => {
      exitSent = true;
      if (open === 0) return send({ t: "exit", id: m.id, code, signal, err: line.hex(), ...out.fields(), rmn: rmDone });
      stderrs.set(m.id, here);
      send({ t: "exit", id: m.id, code, signal, err: line.hex(), ...out.fields(), open: true, rmn: rmDone });
    });
  });
}
// The execserver is gone: stdin (a pipe only it writes) reads EOF, even after its SIGKILL.
// The IPC channel's "disconnect" is not enough: it waits for handles still being passed.
function orphaned() {
  for (const pid of running.values()) {
    try { process.kill(-pid, "SIGKILL"); } catch {}
  }
  process.exit(0);
}
process.stdin.on("error", orphaned);
process.stdin.on("end", orphaned);
process.stdin.on("close", orphaned);
process.stdin.resume();
process.on("disconnect", orphaned);
`;
