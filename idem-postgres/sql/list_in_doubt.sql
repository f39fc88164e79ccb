-- The records in doubt for reconcilers and operators (Operator rule 4): live completed records
-- carrying a mark, due for a check by now too when $1 is true, oldest first, strictly after the
-- position ($2 reserved_at in ms, $3 consumer, $4 route, $5 key) (-1 and empty strings for the
-- first page), at most $6 rows: list_in_progress.sql's order and paging. The partial index
-- `idem_records_in_doubt` holds exactly the rows with a mark, in this order; the moment is read
-- once. Completed is written `state <> 0` (the same for every row the store writes, 0 or 1):
-- without statistics the planner takes `state = 1` to match 0.5% of the rows and would rather
-- sort than read the index in order. Only the first 4 bytes of the response: its status, never
-- its body.
-- An operator's instant out of every range (infinity: a hand-made row) reads as NULL, unknown.
WITH clock AS (
    SELECT clock_timestamp() AS now
)
SELECT consumer, route, key,
       round(extract(epoch FROM reserved_at) * 1000)::bigint AS reserved_ms,
       CASE WHEN isfinite(deadline) THEN floor(date_part('epoch', deadline) * 1000 + 0.0005)::bigint END AS deadline_ms,
       substring(response FROM 1 FOR 4) AS status_prefix,
       CASE WHEN isfinite(completed_at) THEN round(extract(epoch FROM completed_at) * 1000)::bigint END AS completed_ms,
       substr(holder, 1, 300) AS holder, state, doubt,
       CASE WHEN isfinite(doubt_check_at) THEN round(extract(epoch FROM doubt_check_at) * 1000)::bigint END AS doubt_check_ms
FROM idem_records
WHERE doubt IS NOT NULL AND state <> 0 AND deadline > (SELECT now FROM clock)
  AND (NOT $1::boolean OR doubt_check_at <= (SELECT now FROM clock))
  AND (reserved_at, consumer, route, key)
      > ('epoch'::timestamptz + $2 * interval '1 millisecond', $3::text, $4::text, $5::text)
ORDER BY reserved_at, consumer, route, key
LIMIT $6
