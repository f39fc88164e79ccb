-- The records in doubt for reconcilers and operators (Operator rule 4): live completed records
-- (deadline after ?1, now) carrying a mark, due for a check by ?1 too when ?2 is 1, oldest first,
-- strictly after the position (?3 reserved_at, ?4 consumer, ?5 route, ?6 key) (-1 and empty
-- strings for the first page), at most ?7 rows. The partial index `idem_records_in_doubt`
-- holds exactly the rows with a mark, in this order. Only the first 4 bytes of the response:
-- its status, never its body.
SELECT consumer, route, key, reserved_at, deadline, substr(response, 1, 4), completed_at, substr(holder, 1, 300),
       state, doubt, doubt_check_at
FROM idem_records
WHERE doubt IS NOT NULL AND state = 1 AND deadline > ?1 AND (?2 = 0 OR doubt_check_at <= ?1)
  AND (reserved_at, consumer, route, key) > (?3, ?4, ?5, ?6)
ORDER BY reserved_at, consumer, route, key
LIMIT ?7
