import { randomFillSync } from "node:crypto";

/** Random bytes per pipe id: 144 bits, so the base64url text has no padding bits. */
export const PIPE_ID_BYTES = 18;

// Ids come from a pool refilled from the CSPRNG 128 ids at a time: a random read per id
// (two pipes per job) was a measurable part of a job's cost. Every id takes its own bytes.
const POOL_IDS = 128;
const pool = Buffer.alloc(PIPE_ID_BYTES * POOL_IDS);
let taken = POOL_IDS;

/** A fresh pipe id: base64url of PIPE_ID_BYTES random bytes; the id is the credential. */
export function newPipeId(): string {
  if (taken === POOL_IDS) {
    randomFillSync(pool);
    taken = 0;
  }
  const start = taken++ * PIPE_ID_BYTES;
  return pool.toString("base64url", start, start + PIPE_ID_BYTES);
}
