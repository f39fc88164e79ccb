-- Fenced heartbeat (C9).
UPDATE idem_records
SET deadline = ?5
WHERE consumer = ?1 AND route = ?2 AND key = ?3 AND token = ?4 AND state = 0
