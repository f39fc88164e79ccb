-- A record in doubt released (store rule 7, C8): its effect did not happen, the key is given
-- back. Fenced like resolve_settle.sql: a live completed record (deadline after ?5, now) with
-- the token ?4 and exactly the mark read (?6). 0 rows = the record changed since it was read.
DELETE FROM idem_records
WHERE consumer = ?1 AND route = ?2 AND key = ?3 AND token = ?4 AND state = 1 AND deadline > ?5
  AND doubt = ?6
