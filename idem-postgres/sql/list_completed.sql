-- A consumer's live completed records for support (store rule 6): consumer $1, live by the
-- server's clock, on route $2 or every route when it is empty, strictly after the position ($3
-- route, $4 key) (empty strings for the first page), by route then key along the primary key,
-- at most $5 rows. Only the first 4 bytes of the response: its status, never its body; the mark
-- of an answer in doubt and its check time (NULL for none).
-- An operator's instant out of every range (infinity: a hand-made row) reads as NULL, unknown.
SELECT consumer, route, key,
       CASE WHEN isfinite(reserved_at) THEN round(extract(epoch FROM reserved_at) * 1000)::bigint END AS reserved_ms,
       CASE WHEN isfinite(deadline) THEN floor(date_part('epoch', deadline) * 1000 + 0.0005)::bigint END AS deadline_ms,
       substring(response FROM 1 FOR 4) AS status_prefix,
       CASE WHEN isfinite(completed_at) THEN round(extract(epoch FROM completed_at) * 1000)::bigint END AS completed_ms,
       substr(holder, 1, 300) AS holder, state,
       doubt, CASE WHEN isfinite(doubt_check_at) THEN round(extract(epoch FROM doubt_check_at) * 1000)::bigint END AS doubt_check_ms
FROM idem_records
WHERE consumer = $1 AND state = 1 AND deadline > (SELECT clock_timestamp())
  AND ($2::text = '' OR route = $2::text)
  AND (route, key) > ($3::text, $4::text)
ORDER BY route, key
LIMIT $5
