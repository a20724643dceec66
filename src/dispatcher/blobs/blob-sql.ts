/**
 * The queries of the store for inputs and outputs of any size (migration 0004), one named
 * constant per purpose. Durations are passed in milliseconds.
 */

/** A new blob, inside its write transaction. $1 id, $2 item_id, $3 role, $4 chunk_bytes, $5 created_by, $6 orphan ttl ms. */
export const insertBlob = `
INSERT INTO blobs (id, item_id, role, size, sha256, chunk_bytes, created_by, expires_at)
VALUES ($1, $2, $3, 0, '', $4, $5, now() + $6::double precision * interval '1 millisecond')`;

/** One chunk. $1 blob_id, $2 seq, $3 data. */
export const insertChunk = `INSERT INTO blob_chunks (blob_id, seq, data) VALUES ($1, $2, $3)`;

/** The written blob's size and digest, just before commit. $1 id, $2 size, $3 sha256. */
export const finishBlob = `UPDATE blobs SET size = $2, sha256 = $3 WHERE id = $1`;

/**
 * finishBlob for a write that holds a reservation (migration 0008), which ends in the same
 * statement: committed, the bytes move from reserved to stored at once.
 */
export const finishReservedBlob = `
WITH released AS (DELETE FROM blob_reservations WHERE id = $1)
UPDATE blobs SET size = $2, sha256 = $3 WHERE id = $1`;

/** A blob's description. $1 id. */
export const selectBlob = `
SELECT id, item_id, role, size, sha256, chunk_bytes, created_at, expires_at, item_finished_at
FROM blobs WHERE id = $1`;

/** Removes one blob and its chunks. $1 id. */
export const deleteBlob = `DELETE FROM blobs WHERE id = $1 RETURNING size`;

/** Removes every blob of an item. $1 item_id. */
export const deleteItemBlobs = `DELETE FROM blobs WHERE item_id = $1 RETURNING size`;

/**
 * Submit adopts uploads: they belong to item $1 from now on and lose their expiry.
 * $2 uuid[] of uploads. Only unadopted, unexpired inputs qualify; returns those adopted.
 */
export const adoptUploads = `
UPDATE blobs SET item_id = $1, expires_at = NULL
WHERE id = ANY($2::uuid[]) AND item_id IS NULL AND role = 'input' AND expires_at > now()
RETURNING id`;

/**
 * Deletes up to $2 blobs that are due: never adopted and past their expiry, or adopted by
 * an item that finished more than $1 ms ago. Two index range scans.
 */
export const sweepBlobs = `
WITH due AS (
  (SELECT id FROM blobs WHERE expires_at < now() LIMIT $2)
  UNION
  (SELECT id FROM blobs WHERE item_finished_at < now() - $1::double precision * interval '1 millisecond' LIMIT $2)
)
DELETE FROM blobs b USING due WHERE b.id = due.id
RETURNING b.id, b.size, b.role`;

/** Bytes and blobs stored now. */
export const storeUsage = `SELECT coalesce(sum(size), 0)::bigint AS bytes, count(*)::bigint AS blobs FROM blobs`;

/**
 * Reserves room for write $1 of fylr $2 (migration 0008): $3 bytes in all, or as much as
 * fits when that is at least $4; $5 is store.maxTotalBytes (0: no limit). `granted` is
 * NULL when even $4 does not fit.
 */
export const reserve = `SELECT granted, stored, reserved FROM slotbroker_reserve_blob($1, $2, $3, $4, $5)`;

/** Ends write $1's reservation (its bytes were committed or rolled back). */
export const release = `DELETE FROM blob_reservations WHERE id = $1`;

/** Ends the reservations of writes $1 (uuid[]) whose release failed before. */
export const releaseMany = `DELETE FROM blob_reservations WHERE id = ANY($1::uuid[])`;

/**
 * Ends the reservations of fylrs that are gone from `fylrs` (the stale-heartbeat sweep
 * removed them, or they stopped): their writes died with their connections.
 */
export const reclaimReservations = `
DELETE FROM blob_reservations r
WHERE r.fylr_id IS NOT NULL AND NOT EXISTS (SELECT 1 FROM fylrs f WHERE f.id = r.fylr_id)
RETURNING r.id, r.fylr_id, r.bytes`;

/** Committed bytes and the reservations of writes in progress. */
export const quota = `
SELECT (SELECT stored FROM blob_usage) AS stored,
       (SELECT coalesce(sum(bytes), 0) FROM blob_reservations)::bigint AS reserved,
       (SELECT count(*) FROM blob_reservations)::int AS writes`;

/** Bytes on disk of the chunk table (its TOAST table, free-space and visibility maps included; not its index). */
export const chunkTableSize = `SELECT pg_table_size('blob_chunks')::bigint AS bytes`;

/**
 * Gives the space of rolled-back writes back. INDEX_CLEANUP ON: when only a few pages
 * hold dead entries (under 2 %, e.g. after autovacuum did most of the work), a plain
 * VACUUM skips its index pass, keeps those pages, and can never truncate past them.
 */
export const vacuumChunks = `VACUUM (INDEX_CLEANUP ON, TRUNCATE ON) blob_chunks`;

/**
 * The bytes of blob `id` from byte `start` to `end` (exclusive) as binary COPY, one row per
 * chunk, each cut to the range. COPY takes no parameters: every value is a validated uuid
 * or integer, formatted here.
 */
export function copyRange(id: string, chunkBytes: number, start: number, end: number): string {
  const first = Math.floor(start / chunkBytes);
  const last = Math.floor((end - 1) / chunkBytes);
  const from = `CASE WHEN seq = ${first} THEN ${start - first * chunkBytes} ELSE 0 END`;
  const to = `CASE WHEN seq = ${last} THEN ${end - last * chunkBytes} ELSE ${chunkBytes} END`;
  return `COPY (SELECT substring(data FROM ${from} + 1 FOR ${to} - ${from}) FROM blob_chunks
WHERE blob_id = '${id}' AND seq BETWEEN ${first} AND ${last} ORDER BY seq) TO STDOUT (FORMAT binary)`;
}
