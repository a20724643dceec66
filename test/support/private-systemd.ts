/**
 * A private systemd for tests: systemd 252+ as PID 1 of its own PID, mount and cgroup
 * namespaces, so a unit file runs under the real service manager with every sandboxing
 * setting it asks for (seccomp filters, read-only system, private /tmp, user namespace …)
 * on a machine whose PID 1 is not systemd. It sees the host's network (loopback servers
 * of the test reach it) and its own view of the rest:
 * - /etc is an overlay whose upper layer the test fills (`etc`): units, configs, users;
 * - /etc/systemd/system and /lib/systemd/system are empty but for the test's units and
 *   stand-ins for the boot targets, so nothing of the host's (haproxy, postgres …) starts;
 * - its cgroups live below a cgroup of this test in every hierarchy (removed afterwards);
 * - /sys and /proc/sys are read-only and /dev is a private minimal one, so it changes
 *   nothing of the host's kernel settings or devices.
 * Needs root, util-linux (unshare, nsenter) and systemd's binaries; fails naming what is
 * missing.
 */
import { spawn, execFile, type ChildProcess } from "node:child_process";
import { mkdirSync, readdirSync, readFileSync, rmdirSync, writeFileSync, existsSync, statSync } from "node:fs";
import { join } from "node:path";
import { promisify } from "node:util";
import { findExecutable } from "../../harness/system-tools.js";
import { release, track } from "../../harness/resources.js";

const run = promisify(execFile);
const systemdBinary = "/lib/systemd/systemd";

/** What a private systemd starts with. */
export interface PrivateSystemdOptions {
  /** A fresh directory of the test's (under /tmp); the overlay's layers live here. */
  readonly dir: string;
  /** Unit files and drop-ins: name (e.g. "x.service", "x.service.d/log.conf") → text. */
  readonly units: Readonly<Record<string, string>>;
  /** Files under /etc: path relative to /etc → text (configs, env files). */
  readonly etc?: Readonly<Record<string, string>>;
  /** System users to add (a group of the same name each). */
  readonly users?: readonly string[];
  /** Directories bound into the namespace: host path → path inside (under /opt or /srv). */
  readonly binds?: Readonly<Record<string, string>>;
}

/** A running private systemd. */
export interface PrivateSystemd {
  /** systemd's PID as this process sees it. */
  readonly pid: number;
  /** `systemctl ARGS…` inside; resolves with its exit code and output. */
  systemctl(...args: string[]): Promise<{ code: number; out: string }>;
  /** The host's PID of a unit's main process (for /proc/PID/status). */
  mainPid(unit: string): Promise<number>;
  /** Stops systemd (and everything it runs) and removes its cgroups. Idempotent. */
  stop(): Promise<void>;
}

/** Throws naming what is missing unless a private systemd can run here. */
export function requirePrivateSystemd(): void {
  const missing = ["unshare", "nsenter", systemdBinary].filter((tool) => !findExecutable(tool));
  if (missing.length > 0) throw new Error(`a private systemd needs ${missing.join(", ")}: install the Debian packages "systemd" and "util-linux"`);
  if (process.getuid?.() !== 0) throw new Error("a private systemd needs root (namespaces, cgroups, mounts); .ci/run runs as root");
}

// Runs as root: moves itself into a fresh child cgroup of every hierarchy, then re-runs
// itself in new namespaces, where it builds systemd's world and execs systemd.
const bootScript = `#!/bin/bash
set -euo pipefail
dir=$1 tag=$2
if [ "\${SB_INNER:-}" != 1 ]; then
  mapfile -t lines < /proc/self/cgroup
  for line in "\${lines[@]}"; do
    IFS=: read -r _ ctrl path <<< "$line"
    case "$ctrl" in
      "") base=/sys/fs/cgroup/unified ;;
      name=systemd) base=/sys/fs/cgroup/systemd ;;
      *) base=/sys/fs/cgroup/$ctrl ;;
    esac
    [ -d "$base$path" ] || continue
    mkdir -p "$base$path/$tag"
    echo "$base$path/$tag" >> "$dir/cgroups"
    # cpuset (v1) takes no task before its cpus and mems are set.
    if [ "$ctrl" = cpuset ]; then
      cat "$base$path/cpuset.cpus" > "$base$path/$tag/cpuset.cpus"
      cat "$base$path/cpuset.mems" > "$base$path/$tag/cpuset.mems"
    fi
    echo $$ > "$base$path/$tag/cgroup.procs"
  done
  SB_INNER=1 exec unshare --mount --pid --cgroup --uts --ipc --fork --mount-proc --propagation private "$0" "$@"
fi
hierarchies=$(awk '$3 == "cgroup" || $3 == "cgroup2" { print $2 " " $3 " " $4 }' /proc/self/mounts)
mount --bind /sys /sys && mount -o remount,bind,ro /sys
mount --bind /proc/sys /proc/sys && mount -o remount,bind,ro /proc/sys
# Fresh cgroup mounts: in this cgroup namespace they are rooted at the test's cgroups.
mount -t tmpfs -o mode=755 tmpfs /sys/fs/cgroup
while read -r where type options; do
  mkdir -p "$where"
  if [ "$type" = cgroup2 ]; then mount -t cgroup2 cgroup2 "$where"; continue; fi
  subsystems=$(echo "$options" | tr , '\\n' | grep -v -E '^(rw|ro|relatime|nosuid|nodev|noexec)$' | paste -sd, -)
  case "$subsystems" in name=*) subsystems="none,$subsystems" ;; esac
  mount -t cgroup -o "$subsystems" cgroup "$where"
done <<< "$hierarchies"
mount -t overlay overlay -o "lowerdir=/etc,upperdir=$dir/etc,workdir=$dir/etc-work" /etc
mount -t tmpfs tmpfs /etc/systemd/system
cp -r "$dir"/units/. /etc/systemd/system/
mount -t tmpfs tmpfs /lib/systemd/system
mount -t tmpfs tmpfs /run
mount -t tmpfs tmpfs /opt
mount -t tmpfs tmpfs /srv
while read -r from to; do
  [ -n "$from" ] || continue
  mkdir -p "$to" && mount --bind "$from" "$to"
done < "$dir/binds"
mkdir /run/.host-dev && mount --bind /dev /run/.host-dev
mount -t tmpfs -o mode=755 tmpfs /dev
for node in null zero full random urandom tty; do touch "/dev/$node" && mount --bind "/run/.host-dev/$node" "/dev/$node"; done
umount /run/.host-dev && rmdir /run/.host-dev
mkdir -p /dev/pts /dev/shm && mount -t devpts -o newinstance,ptmxmode=0666 devpts /dev/pts && ln -sf pts/ptmx /dev/ptmx
mount -t tmpfs tmpfs /dev/shm
touch /dev/console && mount --bind /dev/null /dev/console
export container=slotbroker-test
exec ${systemdBinary} --system --unit=slotbroker-test.target --log-target=console --log-level=warning
`;

// The boot targets every service depends on, empty.
const targets = ["slotbroker-test", "sysinit", "basic", "shutdown", "network", "network-online", "multi-user"];

/** Starts a private systemd; tracked, so a test that forgets stop() leaks nothing. */
export async function startPrivateSystemd(options: PrivateSystemdOptions): Promise<PrivateSystemd> {
  requirePrivateSystemd();
  const { dir } = options;
  for (const sub of ["etc", "etc-work", "units"]) mkdirSync(join(dir, sub), { recursive: true });
  for (const target of targets) writeFileSync(join(dir, "units", `${target}.target`), `[Unit]\nDescription=${target} (a private systemd's stand-in)\n`);
  for (const [name, text] of Object.entries(options.units)) {
    mkdirSync(join(dir, "units", name, ".."), { recursive: true });
    writeFileSync(join(dir, "units", name), text);
  }
  for (const [path, text] of Object.entries(options.etc ?? {})) {
    mkdirSync(join(dir, "etc", path, ".."), { recursive: true });
    writeFileSync(join(dir, "etc", path), text);
  }
  if (options.users?.length) {
    let passwd = readFileSync("/etc/passwd", "utf8");
    let group = readFileSync("/etc/group", "utf8");
    options.users.forEach((user, i) => {
      const id = 64_100 + i;
      passwd += `${user}:x:${id}:${id}:${user}:/nonexistent:/usr/sbin/nologin\n`;
      group += `${user}:x:${id}:\n`;
    });
    writeFileSync(join(dir, "etc", "passwd"), passwd);
    writeFileSync(join(dir, "etc", "group"), group);
  }
  const binds = Object.entries(options.binds ?? {});
  for (const [, to] of binds) if (!/^\/(opt|srv)\//.test(to)) throw new Error(`private systemd: bind ${to} must be under /opt or /srv`);
  writeFileSync(join(dir, "binds"), binds.map(([from, to]) => `${from} ${to}\n`).join(""));
  const script = join(dir, "boot.sh");
  writeFileSync(script, bootScript, { mode: 0o755 });

  const tag = `slotbroker-test-${process.pid}-${Date.now().toString(36)}`;
  let log = "";
  const child: ChildProcess = spawn("/bin/bash", [script, dir, tag], { stdio: ["ignore", "pipe", "pipe"], detached: true });
  child.stdout!.setEncoding("utf8").on("data", (s: string) => (log = (log + s).slice(-20_000)));
  child.stderr!.setEncoding("utf8").on("data", (s: string) => (log = (log + s).slice(-20_000)));
  const exited = new Promise<void>((resolve) => child.once("exit", () => resolve()));

  let pid = 0;
  // PID 1 of the namespace: killing it ends every process in it.
  const kill = async (): Promise<void> => {
    if (pid) process.kill(pid, "SIGKILL");
    else if (child.exitCode === null) child.kill("SIGKILL");
    await exited;
    removeCgroups(join(dir, "cgroups"), tag);
  };
  const handle = track({} as { stop(): Promise<void> }, "private systemd", kill);
  const stop = (): Promise<void> => release(handle);
  handle.stop = stop;

  // systemd is the only child of unshare (the process spawned above, after its exec).
  const deadline = Date.now() + 30_000;
  while (!pid) {
    if (child.exitCode !== null) {
      await stop();
      throw new Error(`private systemd did not start: ${log}`);
    }
    const children = readChildren(child.pid!);
    if (children.length > 0 && readFileSync(`/proc/${children[0]}/comm`, "utf8").trim() === "systemd") pid = children[0]!;
    else if (Date.now() > deadline) {
      await stop();
      throw new Error(`private systemd did not start within 30 s: ${log}`);
    }
    else await new Promise((r) => setTimeout(r, 50));
  }
  const systemctl = async (...args: string[]): Promise<{ code: number; out: string }> => {
    try {
      const r = await run("nsenter", ["-t", String(pid), "-m", "-p", "-u", "-i", "systemctl", "--no-pager", ...args], { timeout: 60_000 });
      return { code: 0, out: r.stdout + r.stderr };
    } catch (err) {
      const e = err as { code?: number; stdout?: string; stderr?: string };
      return { code: typeof e.code === "number" ? e.code : 1, out: `${e.stdout ?? ""}${e.stderr ?? ""}` };
    }
  };
  for (;;) {
    const state = (await systemctl("is-system-running")).out.trim();
    if (state === "running" || state === "degraded") break;
    if (Date.now() > deadline) {
      await stop();
      throw new Error(`private systemd is "${state}" after 30 s: ${log}`);
    }
    await new Promise((r) => setTimeout(r, 100));
  }
  const mainPid = async (unit: string): Promise<number> => {
    const inner = Number((await systemctl("show", "-p", "MainPID", "--value", unit)).out.trim());
    for (const host of readChildren(pid)) {
      const nspid = /^NSpid:\s+(.*)$/m.exec(readFileSync(`/proc/${host}/status`, "utf8"))?.[1]?.trim().split(/\s+/);
      if (nspid && Number(nspid[nspid.length - 1]) === inner) return host;
    }
    throw new Error(`no process of ${unit} (main PID ${inner} inside)`);
  };
  return Object.assign(handle, { pid, systemctl, mainPid });
}

function readChildren(pid: number): number[] {
  try {
    return readFileSync(`/proc/${pid}/task/${pid}/children`, "utf8").trim().split(/\s+/).filter(Boolean).map(Number);
  } catch {
    return [];
  }
}

// Every cgroup the boot script made, and what systemd made below them, deepest first.
function removeCgroups(list: string, tag: string): void {
  if (!existsSync(list)) return;
  for (const top of readFileSync(list, "utf8").split("\n").filter((p) => p.endsWith(`/${tag}`))) {
    const dirs: string[] = [];
    const walk = (d: string): void => {
      dirs.push(d);
      for (const entry of readdirSync(d)) {
        const sub = join(d, entry);
        if (statSync(sub).isDirectory()) walk(sub);
      }
    };
    if (!existsSync(top)) continue;
    walk(top);
    for (const d of dirs.reverse()) {
      try {
        rmdirSync(d);
      } catch {
        // still busy (a process not yet reaped): left for the kernel's own cleanup
      }
    }
  }
}
