-- Fenced completion (C6): only the token holder of an in-progress record. Runs in the caller's
-- transaction with complete_in, so the effect and the completion commit together. ?7 is now:
-- when the completion landed. ?8 is the mark of an answer in doubt (C8), or NULL for an answer
-- that is the execution's own: a record in doubt is due for a check at once (?7), one without
-- a mark has no check time (store rule 6).
UPDATE idem_records
SET state = 1, response = ?5, deadline = ?6, completed_at = ?7, doubt = ?8,
    doubt_check_at = CASE WHEN ?8 IS NULL THEN NULL ELSE ?7 END
WHERE consumer = ?1 AND route = ?2 AND key = ?3 AND token = ?4 AND state = 0
