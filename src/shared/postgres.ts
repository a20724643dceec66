import pg from "pg";

/**
 * A pg.Pool that never crashes the process over an idle connection: when the server
 * restarts or stops, pg emits 'error' on the pool for idle clients, and an 'error' event
 * without a listener is fatal in Node. The next query reconnects.
 */
export function createPgPool(config: pg.PoolConfig, onIdleError: (err: Error) => void = () => undefined): pg.Pool {
  const pool = new pg.Pool(config);
  pool.on("error", onIdleError);
  return pool;
}
