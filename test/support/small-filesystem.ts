/**
 * A filesystem of a fixed small size for tests of what happens when a disk fills: a tmpfs
 * mounted under a fresh directory. Mounting needs root (CAP_SYS_ADMIN); without it the
 * suite fails, saying so — it is never skipped.
 */
import { execFile } from "node:child_process";
import { chmodSync, mkdirSync, mkdtempSync, rmSync, statfsSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { promisify } from "node:util";
import { track } from "../../harness/resources.js";

const run = promisify(execFile);

/** A mounted filesystem; `unmount` is idempotent and removes the directory. */
export interface SmallFilesystem {
  /** The mount point (mode 755: the embedded Postgres runs as "postgres" when we are root). */
  readonly path: string;
  readonly totalBytes: number;
  /** Bytes an unprivileged process may still write there. */
  freeBytes(): number;
  unmount(): Promise<void>;
}

/** Mounts a tmpfs of `megabytes` MiB; throws, naming what is missing, when this process may not mount. */
export async function mountSmallFilesystem(megabytes: number): Promise<SmallFilesystem> {
  const dir = mkdtempSync(join(tmpdir(), "slotbroker-small-fs-"));
  chmodSync(dir, 0o755);
  const path = join(dir, "mnt");
  mkdirSync(path);
  try {
    await run("mount", ["-t", "tmpfs", "-o", `size=${megabytes}m,mode=0755`, "tmpfs", path]);
  } catch (err) {
    rmSync(dir, { recursive: true, force: true });
    const said = ((err as { stderr?: string }).stderr ?? (err as Error).message).trim();
    throw new Error(
      `this suite puts Postgres's data directory on a ${megabytes} MiB filesystem and needs to mount a tmpfs for it: ` +
        `run it as root (uid ${process.getuid?.() ?? "?"} here) in a container or VM that allows mount (CAP_SYS_ADMIN; docker run --privileged or --cap-add SYS_ADMIN), ` +
        `with util-linux's mount installed. mount said: ${said}`,
      { cause: err },
    );
  }
  let gone: Promise<void> | undefined;
  const unmount = (): Promise<void> =>
    (gone ??= (async () => {
      // A server that has only just exited may still hold files there for a moment.
      for (let attempt = 0; ; attempt++) {
        try {
          await run("umount", [path]);
          break;
        } catch (err) {
          if (attempt >= 20) {
            await run("umount", ["-l", path]).catch(() => undefined);
            throw new Error(`could not unmount ${path}: ${((err as { stderr?: string }).stderr ?? (err as Error).message).trim()}`, { cause: err });
          }
          await new Promise((r) => setTimeout(r, 250));
        }
      }
      rmSync(dir, { recursive: true, force: true });
    })());
  const fs = statfsSync(path);
  const mounted: SmallFilesystem = {
    path,
    totalBytes: fs.blocks * fs.bsize,
    freeBytes: () => {
      const now = statfsSync(path);
      return now.bavail * now.bsize;
    },
    unmount,
  };
  return track(mounted, `tmpfs ${path}`, (m) => m.unmount());
}
