/**
 * The demo execserver of `slotbroker up`: useful commands this machine has (looked up on
 * PATH at start, so a missing tool is left out rather than failing every job), plus the
 * built-in noop.
 */
import { accessSync, constants } from "node:fs";
import { availableParallelism } from "node:os";
import { delimiter, join } from "node:path";
import type { ExecserverConfigInput } from "../execserver/index.js";

/** A candidate service: its name, command and waitgroup. */
interface Candidate {
  readonly name: string;
  readonly command: readonly string[];
  readonly waitgroup: "text" | "slow";
  readonly timeout?: string;
}

// Each reads stdin and writes stdout, so `submit --stdin FILE` does something useful.
const candidates: readonly Candidate[] = [
  { name: "cat", command: ["cat"], waitgroup: "text" },
  { name: "sha256sum", command: ["sha256sum"], waitgroup: "text" },
  { name: "sha1sum", command: ["sha1sum"], waitgroup: "text" },
  { name: "sha512sum", command: ["sha512sum"], waitgroup: "text" },
  { name: "md5sum", command: ["md5sum"], waitgroup: "text" },
  { name: "wc", command: ["wc"], waitgroup: "text" },
  { name: "base64", command: ["base64"], waitgroup: "text" },
  { name: "sort", command: ["sort"], waitgroup: "text" },
  { name: "uniq", command: ["uniq"], waitgroup: "text" },
  { name: "tr", command: ["tr"], waitgroup: "text" },
  { name: "head", command: ["head"], waitgroup: "text" },
  { name: "tail", command: ["tail"], waitgroup: "text" },
  { name: "rev", command: ["rev"], waitgroup: "text" },
  { name: "tac", command: ["tac"], waitgroup: "text" },
  { name: "gzip", command: ["gzip", "-c"], waitgroup: "text" },
  { name: "gunzip", command: ["gzip", "-dc"], waitgroup: "text" },
  { name: "xz", command: ["xz", "-c"], waitgroup: "text" },
  { name: "zstd", command: ["zstd", "-c", "-q"], waitgroup: "text" },
  { name: "jq", command: ["jq"], waitgroup: "text" },
  { name: "sleep", command: ["sleep"], waitgroup: "slow", timeout: "1h" },
];

/** True when `command` is an executable file on PATH (like `command -v`). */
export function onPath(command: string, path = process.env.PATH ?? ""): boolean {
  const dirs = command.includes("/") ? [""] : path.split(delimiter).filter(Boolean);
  for (const dir of dirs) {
    try {
      accessSync(dir ? join(dir, command) : command, constants.X_OK);
      return true;
    } catch {
      // not here
    }
  }
  return false;
}

/**
 * The demo execserver config for `listen` / `adminListen`: waitgroups "text" (one slot per
 * CPU, at least 2), "slow" (4 slots, for sleep) and "bench" (8 slots, the builtin noop).
 */
export function demoExecserverConfig(listen: string, adminListen: string, path = process.env.PATH ?? ""): ExecserverConfigInput {
  const services: ExecserverConfigInput["services"] = { noop: { waitgroup: "bench", builtin: "noop" } };
  for (const c of candidates) {
    if (!onPath(c.command[0]!, path)) continue;
    services[c.name] = { waitgroup: c.waitgroup, command: [...c.command], timeout: c.timeout ?? "10m" };
  }
  return {
    listen,
    adminListen,
    waitgroups: { text: { processes: Math.max(2, availableParallelism()) }, slow: { processes: 4 }, bench: { processes: 8 } },
    services,
  };
}
