// The native job launcher of the current test run: compiled into the run's build from
// native/job-launcher.c (harness/node-children.ts), so tests never use a stale dist/ copy.
import { existsSync } from "node:fs";
import { join } from "node:path";
import { BUILD_ENV } from "../../harness/node-children.js";
import { LAUNCHER_NAME } from "../../src/execserver/runner/job-launcher.js";

/** The run's native launcher, or undefined when it could not be compiled here. */
export function builtNativeLauncher(): string | undefined {
  const build = process.env[BUILD_ENV];
  const path = build && join(build, "native", LAUNCHER_NAME);
  return path && existsSync(path) ? path : undefined;
}
