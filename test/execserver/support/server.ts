import { compileExecserverConfig, type ExecserverConfigInput } from "../../../src/execserver/index.js";
import { startExecserver, type ExecserverHandle, type StartExecserverOptions } from "../../../src/app/execserver.js";
import { track } from "../../../harness/resources.js";
import { closeLater } from "./broker-stream.js";

/**
 * Starts an in-process execserver on loopback port 0 with a small default layout:
 * waitgroup "one" (1 slot) with builtin service "noop", waitgroup "two" (2 slots) with
 * "noop2", and a real command service "sleep" in waitgroup "slow". Tracked for leak checks.
 */
export async function startTestServer(
  overrides: Partial<ExecserverConfigInput> = {},
  options: StartExecserverOptions = {},
): Promise<ExecserverHandle> {
  const config = compileExecserverConfig(
    {
      instanceId: "test-exec",
      listen: "127.0.0.1:0",
      adminListen: "127.0.0.1:0",
      waitgroups: { one: { processes: 1 }, two: { processes: 2 }, slow: { processes: 1 } },
      services: {
        noop: { waitgroup: "one", builtin: "noop" },
        noop2: { waitgroup: "two", builtin: "noop" },
        sleep: { waitgroup: "slow", command: ["sleep"], timeout: "1m", env: ["LC_ALL"] },
      },
      ...overrides,
    },
    "test config",
  );
  const handle = await startExecserver(config, { helloCoalesceMs: 5, ...options });
  return closeLater(track(handle, `execserver ${config.instanceId}`, (h) => h.forceClose()));
}
