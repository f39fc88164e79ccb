-- Pending records for operators (store rule 6): in progress and reserved at least $1 ms ago by
-- the server's clock, oldest first, strictly after the position ($2 reserved_at in ms, $3
-- consumer, $4 route, $5 key) (-1 and empty strings for the first page), at most $6 rows. The
-- index `idem_records_reserved` holds every record in this order, the completed ones too (read
-- and skipped; the planner may sort the in-progress rows it finds there): an index on `state`
-- would make every completion a non-HOT update (migration 5). The moment is computed once so
-- that the planner uses it. The mark of doubt and its check time come along
-- (NULL: a new reservation is not in doubt), as in every listing.
-- An operator's instant out of every range (infinity: a hand-made row) reads as NULL, unknown.
SELECT consumer, route, key,
       round(extract(epoch FROM reserved_at) * 1000)::bigint AS reserved_ms,
       CASE WHEN isfinite(deadline) THEN floor(date_part('epoch', deadline) * 1000 + 0.0005)::bigint END AS deadline_ms,
       NULL::bytea AS status_prefix,
       CASE WHEN isfinite(completed_at) THEN round(extract(epoch FROM completed_at) * 1000)::bigint END AS completed_ms,
       substr(holder, 1, 300) AS holder, state,
       doubt, CASE WHEN isfinite(doubt_check_at) THEN round(extract(epoch FROM doubt_check_at) * 1000)::bigint END AS doubt_check_ms
FROM idem_records
WHERE state = 0
  AND reserved_at <= (SELECT clock_timestamp()) - $1 * interval '1 millisecond'
  AND (reserved_at, consumer, route, key)
      > ('epoch'::timestamptz + $2 * interval '1 millisecond', $3::text, $4::text, $5::text)
ORDER BY reserved_at, consumer, route, key
LIMIT $6
