/**
 * The store's room arithmetic, pure (no I/O; store-room.ts wires it to Postgres and the
 * filesystem): what a write reserves before it stores more, what the database's free disk
 * space allows, and when a VACUUM of rolled-back writes is due.
 */
import type { FreeSpaceFloor } from "./store-config.js";

const MiB = 1 << 20;

/** A write of unknown size reserves this much ahead at a time (at least one chunk). */
export const reserveStepBytes = 16 * MiB;

/**
 * Disk bytes per stored byte until the next checkpoint: the table row and its WAL record
 * (random data measured 1 : 1.0 between the two on PostgreSQL 17; compressible data less).
 */
export const diskBytesPerByte = 2;

/** Postgres adds WAL in whole segments (16 MiB unless initdb was told otherwise), created ahead of use. */
export const walSegmentBytes = 16 * MiB;

/** What a write asks to hold in all: `want` if it fits, else as much as fits down to `least`. */
export interface ReservationAsk {
  readonly want: number;
  readonly least: number;
}

/**
 * What a write asks for before its first byte: its announced size exactly, one step when
 * the size is unknown (and at least one byte must fit, so a full store refuses at once),
 * nothing for an announced empty body.
 */
export function openingAsk(expectedBytes: number | undefined, step: number, maxItemBytes: number): ReservationAsk | undefined {
  if (expectedBytes === 0) return undefined;
  if (expectedBytes !== undefined) return { want: expectedBytes, least: expectedBytes };
  return { want: Math.min(step, maxItemBytes), least: 1 };
}

/** What a write holding `reserved` asks for to take `needed` bytes in all; undefined while it holds enough. */
export function nextAsk(needed: number, reserved: number, step: number, maxItemBytes: number): ReservationAsk | undefined {
  if (needed <= reserved) return undefined;
  return { want: Math.max(needed, Math.min(needed + step, maxItemBytes)), least: needed };
}

/** Total and free bytes of a filesystem (free: what an unprivileged process may still use). */
export interface DiskSpace {
  readonly total: number;
  readonly free: number;
}

/** The floor in bytes on a filesystem of `total` bytes. */
export function floorBytes(floor: FreeSpaceFloor, total: number): number {
  return "bytes" in floor ? floor.bytes : Math.ceil((total * floor.percent) / 100);
}

/**
 * Caps `ask` (by a write holding `held` bytes) to what the disk can take above `floor`,
 * one WAL segment kept aside; undefined when not even `ask.least` fits.
 */
export function capToDisk(ask: ReservationAsk, held: number, space: DiskSpace, floor: number): ReservationAsk | undefined {
  const room = held + Math.max(0, Math.floor((space.free - floor - walSegmentBytes) / diskBytesPerByte));
  if (room < ask.least) return undefined;
  return { want: Math.min(ask.want, room), least: ask.least };
}

/** Bytes for a message: "524288000 bytes (500.0 MiB)". */
export function describeBytes(n: number): string {
  return n >= MiB ? `${n} bytes (${(n / MiB).toFixed(1)} MiB)` : n === 1 ? "1 byte" : `${n} bytes`;
}

/**
 * When to VACUUM the chunk table: once writes that left at least `afterBytes` dead rows
 * behind (rolled back, or swept) were noted, and at most once per `intervalMs`. Times are
 * the caller's monotonic milliseconds.
 */
export class VacuumPacer {
  /** A VACUUM that gave back less than half of what it was for is tried again, this many times in a row at most. */
  static readonly retries = 3;
  private pending = 0;
  private lastStart = -Infinity;
  private retried = 0;

  constructor(
    private readonly afterBytes: number,
    private readonly intervalMs: number,
  ) {}

  /** Bytes noted since the last start. */
  get pendingBytes(): number {
    return this.pending;
  }

  /** Dead bytes a write or a sweep left behind. */
  note(bytes: number): void {
    if (bytes > 0) this.pending += bytes;
  }

  /** True when a VACUUM should start now. */
  due(now: number): boolean {
    return this.pending > 0 && this.pending >= this.afterBytes && now - this.lastStart >= this.intervalMs;
  }

  /** A VACUUM starts: what was pending is its to clear; returns those bytes. */
  start(now: number): number {
    const taken = this.pending;
    this.pending = 0;
    this.lastStart = now;
    return taken;
  }

  /**
   * A VACUUM for `noted` bytes ended having freed `freed` (undefined: it failed). What it
   * could not give back is noted again, a few times: a write still open elsewhere keeps
   * the table's end locked, and rows deleted after it began are not dead to it yet. Space
   * that stays (live rows after it) is reused by later writes instead.
   */
  finish(noted: number, freed: number | undefined): void {
    const missed = freed === undefined ? noted : noted - Math.max(0, freed);
    if (missed > noted / 2 && this.retried < VacuumPacer.retries) {
      this.retried += 1;
      this.pending += missed;
    } else {
      this.retried = 0;
    }
  }
}
