import pg from "pg";

/**
 * A pg.Pool that never crashes the process over a connection error. When the server
 * restarts or stops it sends every backend an error (57P01), and pg emits it as an 'error'
 * event on the client; an 'error' event without a listener is fatal in Node. The pool
 * listens on idle clients only, so a checked-out client that is between queries, or one
 * being ended, would have none: every client gets its own listener when it connects. A
 * query in flight still fails through its own promise, and a broken client is dropped on
 * release; the next query reconnects.
 */
export function createPgPool(config: pg.PoolConfig, onIdleError: (err: Error) => void = () => undefined): pg.Pool {
  const pool = new pg.Pool(config);
  pool.on("error", onIdleError);
  pool.on("connect", (client) => client.on("error", ignoreClientError));
  return pool;
}

function ignoreClientError(): void {}
