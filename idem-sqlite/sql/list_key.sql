-- Every record of key ?1 under any consumer and route, in any state, expired or not (store rule
-- 6), strictly after the position (?2 consumer, ?3 route) (empty strings for the first page), by
-- consumer then route along the `idem_records_key` index, at most ?4 rows. Only the first 4
-- bytes of a completed response: its status, never its body.
SELECT consumer, route, key, reserved_at, deadline,
       CASE WHEN state = 1 THEN substr(response, 1, 4) END, completed_at, substr(holder, 1, 300), state,
       doubt, doubt_check_at
FROM idem_records
WHERE key = ?1 AND (consumer, route) > (?2, ?3)
ORDER BY consumer, route
LIMIT ?4
