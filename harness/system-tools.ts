/**
 * System tools the tests drive for real. A missing one fails the suite that needs it with
 * a message saying what to install — never a silent skip. `.ci/install-system-packages`
 * installs them all (CI runs it; `npm test` needs only curl and openssl, the ecosystem
 * tier `npm run test:ecosystem` the rest).
 */
import { accessSync, constants } from "node:fs";
import { delimiter, isAbsolute, join } from "node:path";

/** The tools and the Debian package that brings each one. */
export const systemTools = {
  haproxy: { path: "/usr/sbin/haproxy", debian: "haproxy" },
  chromium: { path: process.env.SLOTBROKER_CHROMIUM ?? "/usr/bin/chromium", debian: "chromium" },
  curl: { path: "curl", debian: "curl" },
  openssl: { path: "openssl", debian: "openssl" },
  python3: { path: "python3", debian: "python3 python3-venv" },
} as const;

/** Where `command` is (an absolute path, or found on PATH); undefined when it is not there. */
export function findExecutable(command: string): string | undefined {
  const candidates = isAbsolute(command) ? [command] : (process.env.PATH ?? "").split(delimiter).filter(Boolean).map((dir) => join(dir, command));
  for (const candidate of candidates) {
    try {
      accessSync(candidate, constants.X_OK);
      return candidate;
    } catch {
      // not here
    }
  }
  return undefined;
}

/** The tool's path; throws, naming the package to install, when it is missing. */
export function requireTool(tool: keyof typeof systemTools): string {
  const { path, debian } = systemTools[tool];
  const found = findExecutable(path);
  if (found) return found;
  throw new Error(
    `${tool} (${path}) is not installed, and this suite drives it for real: install the Debian package(s) "${debian}" ` +
      `(as root, .ci/install-system-packages installs every package the tests drive), or see the README's Development section`,
  );
}
