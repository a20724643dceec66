/**
 * The Node job launcher's program, used where the native launcher (native/job-launcher.c,
 * which speaks the same protocol) is not built: plain CommonJS run by `node -e`, without
 * the execserver's loaders, flags or NODE_OPTIONS, so it stays a small process (about 50 MB
 * RSS against the execserver's 100+ MB). Forking copies the forking process's page tables, and Node's
 * spawn() blocks until the child has exec'd; done here, that cost is the launcher's, and
 * the execserver's event loop keeps serving other jobs meanwhile.
 *
 * Protocol over the IPC channel (JSON):
 * - in:  {t:"spawn", id, file, args, cwd, env, stdin}
 * - out: {t:"fd", id, n, pid} with the job's stdin (n=0), stdout (1), stderr (2) as the
 *        passed handle, so the execserver reads and writes the job's pipes itself (no byte
 *        passes through this process); with stdin: false the job reads /dev/null and only
 *        n=1 and n=2 come (a passed handle costs a message, its ack and a socket on either
 *        side); then {t:"exit", id, code, signal}
 * - with dir: true in the spawn, the launcher makes cwd (mode 0700) before the job (the
 *        execserver removes it after). A failed mkdir is answered {t:"failed", id, code,
 *        message, dir: true}; a failed spawn removes the directory again.
 * - out: {t:"failed", id, code, message} when the job could not be started.
 * When its stdin or the channel closes (the execserver exited or died), every job not yet
 * reaped here is SIGKILLed by process group and the launcher exits.
 */
export const LAUNCHER_SCRIPT = String.raw`// slotbroker job launcher
"use strict";
const { spawn } = require("node:child_process");
const { mkdirSync, rmdirSync } = require("node:fs");
process.title = "slotbroker-job-launcher";
const running = new Map();
const send = (message, handle) => { if (process.connected) process.send(message, handle, () => {}); };
for (const sig of ["SIGINT", "SIGTERM", "SIGHUP"]) process.on(sig, () => {});
process.on("message", (m) => {
  if (!m || m.t !== "spawn") return;
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
  // The pipes now belong to the execserver: take them from the ChildProcess (which would
  // close stdin at exit) and never read them here.
  const streams = [child.stdin, child.stdout, child.stderr];
  child.stdin = child.stdout = child.stderr = null;
  child.stdio.fill(null);
  streams[1]._handle.readStop();
  streams[2]._handle.readStop();
  running.set(m.id, child.pid);
  streams.forEach((s, n) => { if (s) send({ t: "fd", id: m.id, n, pid: child.pid }, s); });
  child.once("exit", (code, signal) => {
    running.delete(m.id);
    send({ t: "exit", id: m.id, code, signal });
  });
});
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
