/**
 * The store for inputs and outputs of any size, in the queue's own Postgres: every fylr of
 * the queue reads what any other wrote. A blob is streamed in fixed-size chunk rows inside
 * one transaction (a cut-off write leaves nothing) and read back with binary COPY, a range
 * of chunk rows at a time. Memory stays flat whatever the size: a writer holds at most two
 * chunks, a reader what the stream's buffers hold.
 */
import { createHash, randomUUID } from "node:crypto";
import { Readable, Writable } from "node:stream";
import { pipeline } from "node:stream";
import type pg from "pg";
import { to as copyTo } from "pg-copy-streams";
import { Code, SlotbrokerError } from "../../shared/errors.js";
import { StoreLimitError, StoreRoom } from "./store-room.js";
import * as sql from "./blob-sql.js";
import { CopyBinaryDecoder } from "./copy-binary.js";
import { fromPgError } from "../queue/pg-errors.js";
import type { StoreConfig } from "./store-config.js";
import { nextAsk, openingAsk, type ReservationAsk } from "./store-quota.js";

export { StoreLimitError, type StoreLimit } from "./store-room.js";

/** What a blob holds: an uploaded input, an item's output, or stdout between two chained calls. */
export type BlobRole = "input" | "output" | "intermediate";

/** A stored blob as described by its row. */
export interface BlobInfo {
  readonly id: string;
  readonly itemId: string | undefined;
  readonly role: BlobRole;
  readonly size: number;
  /** Lower-case hex. */
  readonly sha256: string;
  readonly chunkBytes: number;
  readonly createdAt: Date;
  /** Set while no item adopted it: deleted after this time. */
  readonly expiresAt: Date | undefined;
}

/** A finished write. */
export interface WrittenBlob {
  readonly id: string;
  readonly size: number;
  readonly sha256: string;
}

/** Options of a new blob. */
export interface BlobWriteOptions {
  readonly role: BlobRole;
  /** The owning item; unset for an upload until a Submit adopts it. */
  readonly itemId?: string;
  /** The size announced up front (Content-Length): reserved, and so checked against the limits, before any byte is stored. */
  readonly expectedBytes?: number;
}

const uuid = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i;

/** Throws INVALID_ARGUMENT unless `id` is a UUID (ids end up inside COPY statements). */
export function checkBlobId(id: string, what = "id"): void {
  if (!uuid.test(id)) throw new SlotbrokerError(Code.InvalidArgument, `${what}: not an upload id (a UUID): "${id.slice(0, 80)}"`);
}

interface BlobRow {
  id: string;
  item_id: string | null;
  role: BlobRole;
  size: string;
  sha256: string;
  chunk_bytes: number;
  created_at: Date;
  expires_at: Date | null;
}

/** Typed access to blobs and blob_chunks over a pool of its own (long transfers must not starve the dispatcher). */
export class BlobStore {
  /** Reservations against the limits, the disk check, the VACUUM of rolled-back writes. */
  readonly room: StoreRoom;

  constructor(
    readonly pool: pg.Pool,
    readonly config: StoreConfig,
    /** Recorded as created_by, for operators; owns this store's reservations. */
    readonly fylrId?: string,
    /** For reservations (short statements); default `pool`. */
    control: pg.Pool = pool,
  ) {
    this.room = new StoreRoom(control, pool, config, fylrId);
  }

  /** A Writable that stores what is written as one blob, committed when it ends; `result` then describes it. */
  createWriter(options: BlobWriteOptions): BlobWriter {
    return new BlobWriter(this, options);
  }

  /** A blob's description, or undefined. */
  async info(id: string): Promise<BlobInfo | undefined> {
    checkBlobId(id);
    const row = (await this.query<BlobRow>("blob info", sql.selectBlob, [id])).rows[0];
    return row && fromRow(row);
  }

  /**
   * The bytes of a blob from `start` to `end` (exclusive; default the whole blob), as a
   * lazy stream: the database is read only once the stream is read. With `stallMs`, a
   * reader that stops pulling that long is cut off (the stream errors), so a stuck HTTP
   * client cannot pin a connection forever; a job's stdin has its job timeout instead (a
   * job may rightly pause reading).
   */
  read(blob: Pick<BlobInfo, "id" | "size" | "chunkBytes">, range: { start?: number; end?: number; stallMs?: number } = {}): Readable {
    checkBlobId(blob.id);
    const start = range.start ?? 0;
    const end = range.end ?? blob.size;
    if (!(Number.isSafeInteger(start) && Number.isSafeInteger(end) && start >= 0 && start <= end && end <= blob.size)) {
      throw new SlotbrokerError(Code.OutOfRange, `bytes ${start}-${end} are outside blob ${blob.id} of ${blob.size} bytes`);
    }
    if (start === end) return Readable.from([], { objectMode: false });
    const pool = this.pool;
    const stallMs = range.stallMs;
    const text = sql.copyRange(blob.id, blob.chunkBytes, start, end);
    async function* chunks(): AsyncGenerator<Buffer> {
      const client = await pool.connect().catch((err: unknown) => {
        throw fromPgError(err, "read stored data: connect");
      });
      let healthy = false;
      let timer: NodeJS.Timeout | undefined;
      const onClientError = (): void => undefined;
      client.on("error", onClientError);
      try {
        const decoder = new CopyBinaryDecoder();
        pipeline(client.query(copyTo(text)), decoder, (err) => {
          if (err) decoder.destroy(fromPgError(err, "read stored data") as Error);
        });
        let bytes = 0;
        for await (const chunk of decoder as AsyncIterable<Buffer>) {
          bytes += chunk.length;
          if (stallMs !== undefined) {
            timer = setTimeout(() => stream.destroy(new SlotbrokerError(Code.DeadlineExceeded, `the reader took no data for ${stallMs} ms (store.stallTimeout)`)), stallMs);
          }
          yield chunk;
          clearTimeout(timer);
        }
        if (bytes !== end - start) throw new SlotbrokerError(Code.DataLoss, `blob ${blob.id}: read ${bytes} bytes, expected ${end - start} (was it deleted meanwhile?)`);
        healthy = true;
      } finally {
        clearTimeout(timer);
        client.off("error", onClientError);
        // A COPY cut short cannot be resumed: the connection goes, not back to the pool.
        client.release(!healthy);
      }
    }
    const stream: Readable = Readable.from(chunks(), { objectMode: false, highWaterMark: 256 << 10 });
    return stream;
  }

  /** Deletes one blob; resolves with its size, or undefined when there was none. */
  async delete(id: string): Promise<number | undefined> {
    checkBlobId(id);
    const row = (await this.query<{ size: string }>("delete blob", sql.deleteBlob, [id])).rows[0];
    return row && Number(row.size);
  }

  /**
   * Deletes the stored data of an item (its input upload, outputs, intermediates) and
   * resolves with the bytes freed. Deleting the item row does the same through the foreign
   * key; this is for callers that keep the row.
   */
  async deleteForItem(itemId: string): Promise<number> {
    checkBlobId(itemId, "item id");
    const rows = (await this.query<{ size: string }>("delete item data", sql.deleteItemBlobs, [itemId])).rows;
    return rows.reduce((sum, r) => sum + Number(r.size), 0);
  }

  /** Deletes blobs that are due (expired orphans, data past the retention); up to `limit` per call. */
  async sweep(limit = 100): Promise<{ blobs: number; bytes: number }> {
    const rows = (await this.query<{ size: string }>("sweep stored data", sql.sweepBlobs, [this.config.retentionMs, limit])).rows;
    const bytes = rows.reduce((sum, r) => sum + Number(r.size), 0);
    this.room.noteDead(bytes);
    return { blobs: rows.length, bytes };
  }

  /** Bytes and blobs stored now. */
  async usage(): Promise<{ bytes: number; blobs: number }> {
    const row = (await this.query<{ bytes: string; blobs: string }>("store usage", sql.storeUsage)).rows[0];
    return { bytes: Number(row?.bytes ?? 0), blobs: Number(row?.blobs ?? 0) };
  }

  /** Refuses an announced size over store.maxItemBytes. */
  checkItemSize(bytes: number): void {
    const max = this.config.maxItemBytes;
    if (bytes > max) throw new StoreLimitError("store.maxItemBytes", `${bytes} bytes, over the ${max}-byte limit per item (store.maxItemBytes)`);
  }

  private async query<R extends pg.QueryResultRow>(what: string, text: string, params: unknown[] = []): Promise<pg.QueryResult<R>> {
    try {
      return await this.pool.query<R>(text, params);
    } catch (err) {
      throw fromPgError(err, what);
    }
  }
}

function fromRow(row: BlobRow): BlobInfo {
  return {
    id: row.id,
    itemId: row.item_id ?? undefined,
    role: row.role,
    size: Number(row.size),
    sha256: row.sha256,
    chunkBytes: row.chunk_bytes,
    createdAt: row.created_at,
    expiresAt: row.expires_at ?? undefined,
  };
}

/**
 * One blob being written, in one transaction on a connection of its own. Chunks are
 * inserted one at a time while the next fills; ending commits, destroying rolls back (the
 * connection is dropped, so even a write stuck mid-statement leaves nothing).
 */
export class BlobWriter extends Writable {
  /** The blob's id, known before the first byte. */
  readonly id = randomUUID();
  private client: pg.PoolClient | undefined;
  private chunk: Buffer;
  // The other of two chunk buffers: node-postgres copies a query's parameters into its
  // own message as the query is sent (the connection is idle then: one insert at a time),
  // so a buffer can be refilled as soon as its insert went out.
  private spare: Buffer;
  private filled = 0;
  private seq = 0;
  private bytes = 0;
  // Bytes handed to the database: what a rollback leaves as dead rows.
  private sent = 0;
  // Bytes this write's reservation holds; every byte is reserved before it is taken.
  private reserved = 0;
  // Set once a reservation was asked for: it must be ended, after the last ask settled.
  private reserving: Promise<unknown> | undefined;
  private readonly hash = createHash("sha256");
  private inflight: Promise<unknown> = Promise.resolve();
  private committed = false;
  private openedResolve!: (error: Error | undefined) => void;
  /**
   * Resolves once the write transaction is open and its first reservation was granted (an
   * announced size that does not fit fails the writer before any byte is taken: await
   * this before accepting a body). Never rejects: resolves with the error that failed the
   * opening (it also arrives as the writer's 'error', but only on a later tick).
   */
  readonly opened = new Promise<Error | undefined>((resolve) => (this.openedResolve = resolve));
  private written: WrittenBlob | undefined;

  constructor(
    private readonly store: BlobStore,
    private readonly options: BlobWriteOptions,
  ) {
    super({ highWaterMark: 256 << 10 });
    this.chunk = Buffer.allocUnsafe(store.config.chunkBytes);
    this.spare = Buffer.allocUnsafe(store.config.chunkBytes);
  }

  /** Bytes taken so far. */
  get size(): number {
    return this.bytes;
  }

  /** The committed blob; undefined until the writer finished. */
  get result(): WrittenBlob | undefined {
    return this.written;
  }

  override _construct(callback: (error?: Error | null) => void): void {
    this.open().then(
      () => {
        callback();
        this.openedResolve(undefined);
      },
      (err: unknown) => {
        callback(err as Error);
        this.openedResolve(err as Error);
      },
    );
  }

  private async open(): Promise<void> {
    const { expectedBytes } = this.options;
    if (expectedBytes !== undefined) this.store.checkItemSize(expectedBytes);
    const ask = openingAsk(expectedBytes, this.store.room.step, this.store.config.maxItemBytes);
    if (ask) await this.hold(ask);
    const client = await this.store.pool.connect().catch((err: unknown) => {
      throw fromPgError(err, "store data: connect");
    });
    this.client = client;
    // A connection the server drops mid-write (stall timeout, restart) must fail this
    // write, not crash the process: a checked-out client has no other 'error' listener.
    client.on("error", (err) => this.destroy(fromPgError(err, "store data") as Error));
    await this.run("store data: begin", "BEGIN");
    const { config, fylrId } = this.store;
    await this.run("store data", sql.insertBlob, [this.id, this.options.itemId ?? null, this.options.role, config.chunkBytes, fylrId ?? null, config.orphanTtlMs]);
  }

  override _write(data: Buffer, _encoding: BufferEncoding, callback: (error?: Error | null) => void): void {
    this.take(data).then(() => callback(), (err: unknown) => callback(err as Error));
  }

  private async take(data: Buffer): Promise<void> {
    this.bytes += data.length;
    const max = this.store.config.maxItemBytes;
    if (this.bytes > max) throw new StoreLimitError("store.maxItemBytes", `more than ${max} bytes, over the limit per item (store.maxItemBytes)`);
    const ask = nextAsk(this.bytes, this.reserved, this.store.room.step, max);
    if (ask) await this.hold(ask);
    this.hash.update(data);
    let offset = 0;
    while (offset < data.length) {
      const n = Math.min(this.chunk.length - this.filled, data.length - offset);
      data.copy(this.chunk, this.filled, offset, offset + n);
      this.filled += n;
      offset += n;
      if (this.filled === this.chunk.length) await this.flushChunk();
    }
  }

  private async hold(ask: ReservationAsk): Promise<void> {
    const asked = this.store.room.reserve(this.id, ask, this.reserved);
    this.reserving = asked.catch(() => undefined);
    this.reserved = await asked;
  }

  // One insert in flight while the next chunk fills: the pipe keeps moving, memory stays at two chunks.
  private async flushChunk(): Promise<void> {
    await this.inflight;
    const full = this.filled === this.chunk.length ? this.chunk : this.chunk.subarray(0, this.filled);
    [this.chunk, this.spare] = [this.spare, this.chunk];
    this.filled = 0;
    this.sent += full.length;
    const insert = this.run("store data", sql.insertChunk, [this.id, this.seq++, full]);
    insert.catch(() => undefined);
    this.inflight = insert;
  }

  override _final(callback: (error?: Error | null) => void): void {
    this.commit().then(() => callback(), (err: unknown) => callback(err as Error));
  }

  private async commit(): Promise<void> {
    if (this.filled > 0) await this.flushChunk();
    await this.inflight;
    const sha256 = this.hash.digest("hex");
    await this.run("store data", this.reserving ? sql.finishReservedBlob : sql.finishBlob, [this.id, this.bytes, sha256]);
    await this.run("store data: commit", "COMMIT");
    this.committed = true;
    this.client?.removeAllListeners("error");
    this.client?.release();
    this.client = undefined;
    this.written = { id: this.id, size: this.bytes, sha256 };
  }

  override _destroy(error: Error | null, callback: (error?: Error | null) => void): void {
    if (this.client && !this.committed) {
      const client = this.client;
      this.client = undefined;
      client.removeAllListeners("error");
      client.on("error", () => undefined);
      // Dropping the connection rolls the transaction back on the server, also while an
      // insert is still in flight.
      client.release(error ?? new Error("the write was abandoned"));
    }
    if (!this.committed) {
      const { room } = this.store;
      room.noteDead(this.sent);
      // After the last ask settled, or a grant landing late would outlive the write.
      if (this.reserving) void this.reserving.then(() => room.release(this.id));
    }
    callback(error);
  }

  private async run(what: string, text: string, params?: unknown[]): Promise<void> {
    const client = this.client;
    if (!client) throw new SlotbrokerError(Code.Aborted, `${what}: the write was abandoned`);
    try {
      await client.query(text, params);
    } catch (err) {
      throw fromPgError(err, what);
    }
  }
}
