-- Fenced completion (C6): only the token holder of an in-progress record. Runs in the caller's
-- transaction with complete_in, so the effect and the completion commit together. ?7 is now:
-- when the completion landed.
UPDATE idem_records
SET state = 1, response = ?5, deadline = ?6, completed_at = ?7
WHERE consumer = ?1 AND route = ?2 AND key = ?3 AND token = ?4 AND state = 0
