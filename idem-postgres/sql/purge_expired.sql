-- One bounded batch of expired records (C10), through idem_records_reserved (by reservation
-- time): a window of the 4 x $1 records after the position where the last call stopped ($2
-- reserved_at in ms, $3 consumer, $4 route, $5 key; the smallest bigint and empty strings: from
-- the oldest),
-- and among them the expired ones, at most $1. No index on the deadline: the completion
-- changes it, and must stay a HOT update (migration 5). Each call moves the window on, and it
-- starts from the oldest again once it reaches the end, so a record kept longer than those
-- reserved after it (a longer retention, a renewed lease) never holds their purge back. The
-- moment is computed once, `(SELECT clock_timestamp())`. Rows another transaction holds (a
-- completion being committed, a takeover) are skipped, never waited for, so purge does not
-- block live traffic and live traffic does not block purge. Expired audit entries follow,
-- with what is left of the batch (reconciliations_purge.sql).
-- A reservation time out of every range (-infinity, infinity: no row the store writes, but a
-- hand-made or restored one) is a position too, the smallest and the largest bigint, so that
-- one such row never stops the purge of all the others. `CAST($2 AS bigint)`, not `$2::bigint`:
-- inlined as a literal (the simple protocol), a negative `$2` must be cast whole.
-- Returns one row: how many were deleted, how many the window held, and its last position
-- (NULL for an empty window).
WITH window_rows AS (
    SELECT ctid, reserved_at, consumer, route, key
    FROM idem_records
    WHERE (reserved_at, consumer, route, key)
          > (CASE CAST($2 AS bigint)
                 WHEN '-9223372036854775808'::bigint THEN '-infinity'::timestamptz
                 WHEN '9223372036854775807'::bigint THEN 'infinity'::timestamptz
                 ELSE 'epoch'::timestamptz + $2 * interval '1 millisecond'
             END, $3::text, $4::text, $5::text)
    ORDER BY reserved_at, consumer, route, key
    LIMIT 4 * $1
),
doomed AS (
    SELECT ctid FROM idem_records
    WHERE ctid = ANY (ARRAY(SELECT ctid FROM window_rows))
      AND deadline <= (SELECT clock_timestamp())
    LIMIT $1
    FOR UPDATE SKIP LOCKED
),
deleted AS (
    DELETE FROM idem_records WHERE ctid IN (SELECT ctid FROM doomed) RETURNING 1
),
last_row AS (
    SELECT reserved_at, consumer, route, key
    FROM window_rows
    ORDER BY reserved_at DESC, consumer DESC, route DESC, key DESC
    LIMIT 1
)
SELECT (SELECT count(*) FROM deleted) AS purged,
       (SELECT count(*) FROM window_rows) AS scanned,
       (SELECT CASE
                   WHEN reserved_at = '-infinity' THEN '-9223372036854775808'::bigint
                   WHEN reserved_at = 'infinity' THEN '9223372036854775807'::bigint
                   ELSE round(extract(epoch FROM reserved_at) * 1000)::bigint
               END FROM last_row) AS reserved_ms,
       (SELECT consumer FROM last_row) AS consumer,
       (SELECT route FROM last_row) AS route,
       (SELECT key FROM last_row) AS key
