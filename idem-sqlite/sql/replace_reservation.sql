-- Takeover of an orphan (C9) or start over after retention (C10): compare-and-set on the record
-- the decision saw, still carrying its token and still expired at ?8 (now). A late completion
-- or a renewal moves the deadline, so it is never overwritten. 0 rows = the record changed.
UPDATE idem_records
SET fingerprint = ?4, token = ?5, state = 0, deadline = ?6, response = NULL
WHERE consumer = ?1 AND route = ?2 AND key = ?3 AND token = ?7 AND deadline <= ?8
