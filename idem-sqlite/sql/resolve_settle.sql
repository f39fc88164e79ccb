-- A record in doubt settled (store rule 7): fenced on a live completed record (deadline after ?5,
-- now) that still carries the token (?4) and exactly the mark the decider read (?6). The real
-- answer (?7) replaces the one in doubt and is replayed until ?8 (now + retention), never
-- sooner than the record's deadline (a settled key never turns new before it would have); the
-- mark and its check time are cleared; completed_at stays (when the execution's completion landed).
-- 0 rows = the record changed since it was read: nothing is written.
UPDATE idem_records
SET response = ?7, deadline = max(deadline, ?8), doubt = NULL, doubt_check_at = NULL
WHERE consumer = ?1 AND route = ?2 AND key = ?3 AND token = ?4 AND state = 1 AND deadline > ?5
  AND doubt = ?6
