-- A record in doubt still unknown (store rule 7): the answer in doubt stays, the mark becomes ?7
-- (one more attempt) and the record is due again at ?8 (now + the delay). Fenced like
-- resolve_settle.sql: a live completed record (deadline after ?5, now) with the token ?4 and
-- exactly the mark read (?6). 0 rows = the record changed since it was read.
UPDATE idem_records
SET doubt = ?7, doubt_check_at = ?8
WHERE consumer = ?1 AND route = ?2 AND key = ?3 AND token = ?4 AND state = 1 AND deadline > ?5
  AND doubt = ?6
