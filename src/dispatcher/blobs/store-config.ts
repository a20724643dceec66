/**
 * Settings of the queue's store for inputs and outputs of any size: the `store:` section
 * of the fylr config, validated once into a fully defaulted object. Sizes accept units
 * ("64KiB", "10GiB"); durations too ("1h", "7d"); the free-space floor a percentage too.
 */
import { z } from "zod";
import { byteSize, durationMs, parseByteSize, parseConfig } from "../../shared/config-parsing.js";

/** The free space a write must leave on the database's filesystem: bytes, or a share of the filesystem's size. */
export type FreeSpaceFloor = { readonly bytes: number } | { readonly percent: number };

/** The compiled store configuration. */
export interface StoreConfig {
  /** Outputs up to this size stay in the item row; larger ones go to the store and the row keeps their first bytes (default 64 KiB). */
  readonly inlineBytes: number;
  /** Largest input upload and largest output (or intermediate stdout) of one item (default 64 GiB). */
  readonly maxItemBytes: number;
  /**
   * All stored bytes together, writes in progress included (each reserves what it takes
   * before writing it); 0 means no limit (default 16 GiB).
   */
  readonly maxTotalBytes: number;
  /** A path on the filesystem of the Postgres data directory, when this host can see it (`up` sets it); unset: no free-space check. */
  readonly diskPath: string | undefined;
  /** What a write must leave free on that filesystem (default 10 % of it). */
  readonly minFreeSpace: FreeSpaceFloor;
  /** A rolled-back write (or a sweep) that left this many bytes dead starts a VACUUM of the chunk table (default 64 MiB). */
  readonly vacuumAfterBytes: number;
  /** At most one such VACUUM per fylr this often (default 10 s). */
  readonly vacuumIntervalMs: number;
  /** Stored data of a finished item is deleted this long after it finished (default 7 days). */
  readonly retentionMs: number;
  /** An upload no Submit adopted, or an output no completion recorded, is deleted after this (default 1 h). */
  readonly orphanTtlMs: number;
  /** A store transfer that moves no byte for this long is cut off and rolled back (default 60 s). */
  readonly stallTimeoutMs: number;
  /** How often a fylr deletes expired data (default 1 min). */
  readonly sweepIntervalMs: number;
  /** Database connections for streaming stored data, apart from the dispatcher's (default 4). */
  readonly poolSize: number;
  /** Bytes per chunk row (default 256 KiB). */
  readonly chunkBytes: number;
}

const MiB = 1 << 20;

/** "10%" (of the filesystem) or a byte size ("2GiB"). */
const freeSpaceFloor = z.union([z.number().int().nonnegative(), z.string()]).transform((value, ctx): FreeSpaceFloor => {
  const percent = typeof value === "string" ? /^\s*(\d+(?:\.\d+)?)\s*%\s*$/.exec(value) : null;
  if (percent) {
    const n = Number(percent[1]);
    if (n < 100) return { percent: n };
    ctx.addIssue({ code: "custom", message: `must be below 100%, got "${value}"` });
    return z.NEVER;
  }
  const bytes = typeof value === "number" ? value : parseByteSize(value);
  if (bytes === undefined) {
    ctx.addIssue({ code: "custom", message: `expected a share of the filesystem such as "10%" or a size such as "2GiB", got "${String(value)}"` });
    return z.NEVER;
  }
  return { bytes };
});

/** The YAML shape of the `store:` section; every key optional. */
export const storeConfigSchema = z
  .strictObject({
    inlineBytes: byteSize.prefault("64KiB"),
    maxItemBytes: byteSize.prefault("64GiB"),
    maxTotalBytes: byteSize.prefault("16GiB"),
    diskPath: z.string().min(1).optional(),
    minFreeSpace: freeSpaceFloor.prefault("10%"),
    vacuumAfterBytes: byteSize.prefault("64MiB"),
    vacuumInterval: durationMs.prefault("10s"),
    retention: durationMs.prefault("7d"),
    orphanTtl: durationMs.prefault("1h"),
    stallTimeout: durationMs.prefault("60s"),
    sweepInterval: durationMs.prefault("1m"),
    poolSize: z.number().int().min(1).max(1000).default(4),
    chunkBytes: byteSize.prefault("256KiB"),
  })
  .superRefine((c, ctx) => {
    if (c.inlineBytes > 16 * MiB) ctx.addIssue({ code: "custom", path: ["inlineBytes"], message: "must be at most 16MiB (it is kept in the item row)" });
    if (c.maxItemBytes < 1) ctx.addIssue({ code: "custom", path: ["maxItemBytes"], message: "must be at least 1 byte" });
    if (c.chunkBytes < 64 * 1024 || c.chunkBytes > 64 * MiB) ctx.addIssue({ code: "custom", path: ["chunkBytes"], message: "must be 64KiB…64MiB" });
    for (const key of ["retention", "orphanTtl", "stallTimeout", "sweepInterval", "vacuumInterval"] as const) {
      if (c[key] <= 0) ctx.addIssue({ code: "custom", path: [key], message: "must be longer than 0" });
    }
  })
  .transform(
    (c): StoreConfig => ({
      inlineBytes: c.inlineBytes,
      maxItemBytes: c.maxItemBytes,
      maxTotalBytes: c.maxTotalBytes,
      diskPath: c.diskPath,
      minFreeSpace: c.minFreeSpace,
      vacuumAfterBytes: c.vacuumAfterBytes,
      vacuumIntervalMs: c.vacuumInterval,
      retentionMs: c.retention,
      orphanTtlMs: c.orphanTtl,
      stallTimeoutMs: c.stallTimeout,
      sweepIntervalMs: c.sweepInterval,
      poolSize: c.poolSize,
      chunkBytes: c.chunkBytes,
    }),
  );

/** Validates a raw `store:` section; a ConfigError names the bad key. */
export function compileStoreConfig(raw: unknown = {}, source = "store"): StoreConfig {
  return parseConfig(storeConfigSchema, raw ?? {}, source);
}

/** The defaults, with `overrides` on top (for tests and embedding). */
export function storeConfig(overrides: Partial<StoreConfig> = {}): StoreConfig {
  return { ...compileStoreConfig({}), ...overrides };
}
