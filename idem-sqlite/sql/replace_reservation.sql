-- Takeover of an orphan (C9) or start over after retention (C10): compare-and-set on the record
-- the decision saw: it still carries its token (?7), is still in the state the decision saw
-- (?9: 0 = in progress for a takeover, 1 = completed for a start over) and is still expired at
-- ?8 (now). A late completion or a renewal moves the deadline or the state, so it is never
-- overwritten; a clock stepped back cannot turn a completed record into a takeover.
-- 0 rows = the record changed. A takeover is a new reservation: reserved_at is now, the holder
-- is the taker (?10), no completion has landed, and the new execution is not in doubt.
UPDATE idem_records
SET fingerprint = ?4, token = ?5, state = 0, deadline = ?6, response = NULL, reserved_at = ?8,
    completed_at = NULL, holder = ?10, doubt = NULL, doubt_check_at = NULL
WHERE consumer = ?1 AND route = ?2 AND key = ?3 AND token = ?7 AND deadline <= ?8 AND state = ?9
