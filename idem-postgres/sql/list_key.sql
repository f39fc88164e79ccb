-- Every record of key $1 under any consumer and route, in any state, expired or not (store rule
-- 6), strictly after the position ($2 consumer, $3 route) (empty strings for the first page), by
-- consumer then route along the `idem_records_key` index, at most $4 rows. Only the first 4
-- bytes of a completed response: its status, never its body; the mark of an answer in doubt and
-- its check time (NULL for none).
-- An operator's instant out of every range (infinity: a hand-made row) reads as NULL, unknown.
SELECT consumer, route, key, state,
       CASE WHEN isfinite(reserved_at) THEN round(extract(epoch FROM reserved_at) * 1000)::bigint END AS reserved_ms,
       CASE WHEN isfinite(deadline) THEN floor(date_part('epoch', deadline) * 1000 + 0.0005)::bigint END AS deadline_ms,
       CASE WHEN state = 1 THEN substring(response FROM 1 FOR 4) END AS status_prefix,
       CASE WHEN isfinite(completed_at) THEN round(extract(epoch FROM completed_at) * 1000)::bigint END AS completed_ms,
       substr(holder, 1, 300) AS holder,
       doubt, CASE WHEN isfinite(doubt_check_at) THEN round(extract(epoch FROM doubt_check_at) * 1000)::bigint END AS doubt_check_ms
FROM idem_records
WHERE key = $1::text AND (consumer, route) > ($2::text, $3::text)
ORDER BY consumer, route
LIMIT $4
