/**
 * The fylr status page's queries: both use an index (the partial claim/held indexes for the
 * open-item count, the primary key for the recent items), so polling them every second
 * stays cheap however many finished rows the table keeps.
 */

/** Open items (queued, claimed, running) of all fylrs, by kind, state and priority. */
export const openItemsByPriority = `
SELECT kind, state, priority, count(*)::int AS n FROM queue_items
WHERE state IN ('queued', 'claimed', 'running')
GROUP BY kind, state, priority`;

/** Some items by id ($1: uuid[]), with the error cut to one line's worth. */
export const itemsById = `
SELECT id, kind, priority, state, attempts, max_attempts, claimed_by, created_at, updated_at, finished_at, left(error, 240) AS error
FROM queue_items WHERE id = ANY($1::uuid[])`;
