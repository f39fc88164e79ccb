-- A consumer's live completed records for support (store rule 6): consumer ?1, live at ?2 (now),
-- on route ?3 or every route when it is NULL, strictly after the position (?4 route, ?5 key)
-- (empty strings for the first page), by route then key along the primary key, at most ?6
-- rows. Only the first 4 bytes of the response: its status, never its body.
SELECT consumer, route, key, reserved_at, deadline, substr(response, 1, 4), completed_at, substr(holder, 1, 300),
       state, doubt, doubt_check_at
FROM idem_records
WHERE consumer = ?1 AND state = 1 AND deadline > ?2 AND (?3 IS NULL OR route = ?3)
  AND (route, key) > (?4, ?5)
ORDER BY route, key
LIMIT ?6
