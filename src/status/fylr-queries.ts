/**
 * The fylr status page's queries. Both stay on indexes, so polling them every second costs
 * the same however many finished rows the table keeps: the open-item count reads the two
 * partial indexes (claim path: an index-only scan; held items: bounded by the fylrs'
 * admission) instead of filtering the whole table, and recent items go by primary key.
 */

/** Open items (queued, claimed, running) of all fylrs, by kind, state and priority. */
export const openItemsByPriority = `
SELECT kind, state, priority, count(*)::int AS n FROM (
  SELECT kind, 'queued' AS state, priority FROM queue_items WHERE state = 'queued'
  UNION ALL
  SELECT kind, state, priority FROM queue_items WHERE state IN ('claimed', 'running')
) AS open_items
GROUP BY kind, state, priority`;

/** Some items by id ($1: uuid[]), with the error cut to one line's worth. */
export const itemsById = `
SELECT id, kind, priority, state, attempts, max_attempts, claimed_by, created_at, updated_at, finished_at, left(error, 240) AS error
FROM queue_items WHERE id = ANY($1::uuid[])`;
