-- Pending records for operators (store rule 6): in progress and reserved at or before ?1
-- (now - the age asked), oldest first, strictly after the position (?2 reserved_at, ?3 consumer,
-- ?4 route, ?5 key) (-1 and empty strings for the first page), at most ?6 rows. The partial
-- index `idem_records_in_progress` holds exactly these rows, in this order.
SELECT consumer, route, key, reserved_at, deadline, NULL, completed_at, substr(holder, 1, 300), state,
       doubt, doubt_check_at
FROM idem_records
WHERE state = 0 AND reserved_at <= ?1 AND (reserved_at, consumer, route, key) > (?2, ?3, ?4, ?5)
ORDER BY reserved_at, consumer, route, key
LIMIT ?6
