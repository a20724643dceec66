/**
 * Room for the store's writes, shared by every fylr of the queue: a write reserves the
 * bytes it is about to store (store.maxTotalBytes, counted over committed blobs and every
 * write in progress) and, where this host sees the database's filesystem, what they will
 * take on disk (store.minFreeSpace). Reservations live in the database, so a write on one
 * fylr is refused for what another is writing; they end with the write's commit, right
 * after it failed, or when its fylr is gone. Rolled-back writes leave dead rows: once
 * enough piled up, a VACUUM gives the space back.
 */
import { statfs } from "node:fs/promises";
import type pg from "pg";
import { Code, ConfigError, SlotbrokerError } from "../../shared/errors.js";
import * as sql from "./blob-sql.js";
import { fromPgError } from "../queue/pg-errors.js";
import type { StoreConfig } from "./store-config.js";
import { capToDisk, describeBytes, diskBytesPerByte, floorBytes, reserveStepBytes, VacuumPacer, walSegmentBytes, type DiskSpace, type ReservationAsk } from "./store-quota.js";

/** The limit a refused write ran into, for the HTTP status and the message. */
export type StoreLimit = "store.maxItemBytes" | "store.maxTotalBytes" | "store.minFreeSpace";

/** A write refused by a configured limit; `limit` names the key. */
export class StoreLimitError extends SlotbrokerError {
  override name = "StoreLimitError";
  constructor(
    readonly limit: StoreLimit,
    message: string,
  ) {
    super(Code.ResourceExhausted, message, { details: { limit } });
  }
}

/** Committed bytes and the reservations of writes in progress. */
export interface StoreQuota {
  readonly stored: number;
  readonly reserved: number;
  /** Writes in progress (their reservations). */
  readonly writes: number;
}

/** Reservations ended because their fylr is gone. */
export interface ReclaimedRoom {
  readonly fylrs: readonly string[];
  readonly reservations: number;
  readonly bytes: number;
}

/** A VACUUM of the chunk table, with its size before and after. */
export interface VacuumReport {
  /** Dead bytes noted since the last one. */
  readonly noted: number;
  readonly beforeBytes: number;
  readonly afterBytes: number;
}

/** Reservations, the disk check and the VACUUM of one fylr's store. */
export class StoreRoom {
  /** A write of unknown size reserves this much ahead. */
  readonly step: number;
  // Releases that failed (the database was away): retried by reclaim().
  private readonly unreleased = new Set<string>();
  private readonly pacer: VacuumPacer;

  constructor(
    /** Short statements: reservations must not wait behind the long transfers of the store's own pool. */
    private readonly control: pg.Pool,
    /** The store's pool, for the VACUUM. */
    private readonly pool: pg.Pool,
    readonly config: StoreConfig,
    private readonly fylrId: string | undefined,
  ) {
    this.step = Math.max(config.chunkBytes, reserveStepBytes);
    this.pacer = new VacuumPacer(config.vacuumAfterBytes, config.vacuumIntervalMs);
  }

  /**
   * Makes write `id`, which holds `held` bytes, hold `ask.want` in all (or as much as fits
   * down to `ask.least`); resolves with what it holds now. Throws a StoreLimitError naming
   * the limit and the numbers when not even `ask.least` fits.
   */
  async reserve(id: string, ask: ReservationAsk, held: number): Promise<number> {
    let asked = ask;
    const { diskPath, maxTotalBytes } = this.config;
    if (diskPath) {
      const space = await this.space(diskPath);
      const floor = floorBytes(this.config.minFreeSpace, space.total);
      const capped = capToDisk(ask, held, space, floor);
      if (!capped) throw this.diskFull(ask.least - held, space, floor, diskPath);
      asked = capped;
    }
    type Row = { granted: string | null; stored: string; reserved: string };
    const row = (await this.query<Row>("reserve store room", sql.reserve, [id, this.fylrId ?? null, asked.want, asked.least, maxTotalBytes])).rows[0];
    if (row && row.granted !== null) return Number(row.granted);
    const stored = Number(row?.stored ?? 0);
    const reserved = Number(row?.reserved ?? 0);
    throw new StoreLimitError(
      "store.maxTotalBytes",
      `${describeBytes(ask.least - held)} more ${ask.least - held === 1 ? "does" : "do"} not fit under store.maxTotalBytes (${describeBytes(maxTotalBytes)}): ` +
        `the store holds ${describeBytes(stored)} and writes in progress reserve ${describeBytes(reserved)}`,
    );
  }

  /** Ends write `id`'s reservation. Never rejects: a failed release is retried by reclaim(). */
  async release(id: string): Promise<void> {
    try {
      await this.control.query(sql.release, [id]);
    } catch {
      this.unreleased.add(id);
    }
  }

  /**
   * Ends the reservations of fylrs that are gone (their writes died with them; the rows
   * those left are noted for the VACUUM) and retries releases that failed.
   */
  async reclaim(): Promise<ReclaimedRoom> {
    if (this.unreleased.size > 0) {
      const ids = [...this.unreleased];
      await this.query("release store room", sql.releaseMany, [ids]);
      for (const id of ids) this.unreleased.delete(id);
    }
    const rows = (await this.query<{ fylr_id: string; bytes: string }>("reclaim store room", sql.reclaimReservations)).rows;
    const bytes = rows.reduce((sum, r) => sum + Number(r.bytes), 0);
    this.pacer.note(bytes);
    return { fylrs: [...new Set(rows.map((r) => r.fylr_id))], reservations: rows.length, bytes };
  }

  /** Committed bytes and what writes in progress reserve. */
  async quota(): Promise<StoreQuota> {
    const row = (await this.query<{ stored: string; reserved: string; writes: number }>("store quota", sql.quota)).rows[0];
    return { stored: Number(row?.stored ?? 0), reserved: Number(row?.reserved ?? 0), writes: row?.writes ?? 0 };
  }

  /** A write left `bytes` of dead rows behind (it was rolled back, or a sweep deleted them). */
  noteDead(bytes: number): void {
    this.pacer.note(bytes);
  }

  /** True when enough dead bytes were noted and the last VACUUM is long enough ago. */
  vacuumDue(now = performance.now()): boolean {
    return this.pacer.due(now);
  }

  /** VACUUMs the chunk table, giving emptied pages at its end back to the filesystem. Run one at a time. */
  async vacuum(): Promise<VacuumReport> {
    const noted = this.pacer.start(performance.now());
    let freed: number | undefined;
    try {
      const size = async (): Promise<number> => Number((await this.query<{ bytes: string }>("store size", sql.chunkTableSize)).rows[0]?.bytes ?? 0);
      const beforeBytes = await size();
      await this.query("vacuum the store", sql.vacuumChunks, [], this.pool);
      const afterBytes = await size();
      freed = beforeBytes - afterBytes;
      return { noted, beforeBytes, afterBytes };
    } finally {
      this.pacer.finish(noted, freed);
    }
  }

  /** Throws a ConfigError naming store.diskPath when its filesystem cannot be read. */
  async checkDiskPath(): Promise<void> {
    const path = this.config.diskPath;
    if (!path) return;
    await this.space(path).catch((err: unknown) => {
      throw new ConfigError(`store.diskPath: ${(err as Error).message}`, { cause: err });
    });
  }

  // Free space as an unprivileged process sees it (root's reserved blocks are not the database's).
  private async space(path: string): Promise<DiskSpace> {
    try {
      const s = await statfs(path);
      return { total: s.blocks * s.bsize, free: s.bavail * s.bsize };
    } catch (err) {
      // Unknown free space refuses the write: the check exists so the disk never fills.
      throw new SlotbrokerError(Code.Unavailable, `cannot read the free space at ${path} (store.diskPath): ${(err as Error).message}`, { cause: err });
    }
  }

  private diskFull(more: number, space: DiskSpace, floor: number, path: string): StoreLimitError {
    const spec = this.config.minFreeSpace;
    const floorText = "percent" in spec ? `${spec.percent}% of ${describeBytes(space.total)}, ${describeBytes(floor)}` : describeBytes(floor);
    return new StoreLimitError(
      "store.minFreeSpace",
      `${describeBytes(more)} more would leave less than store.minFreeSpace (${floorText}) free on the database's filesystem at ${path}: ` +
        `${describeBytes(space.free)} are free, and the database takes about ${diskBytesPerByte}× what it stores until its next checkpoint (the table and its WAL) plus a ${walSegmentBytes >> 20} MiB WAL segment`,
    );
  }

  private async query<R extends pg.QueryResultRow>(what: string, text: string, params: unknown[] = [], pool: pg.Pool = this.control): Promise<pg.QueryResult<R>> {
    try {
      return await pool.query<R>(text, params);
    } catch (err) {
      throw fromPgError(err, what);
    }
  }
}
