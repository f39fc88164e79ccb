-- Takeover of an orphan (C9) or start over after retention (C10): compare-and-set on the record
-- the decision saw: it still carries its token ($7), is still in the state the decision saw ($8:
-- 0 = in progress for a takeover, 1 = completed for a start over) and is still expired by the
-- server's clock. A late completion or a renewal moves the state or the deadline, so it is never
-- overwritten. A takeover is a new reservation: reserved_at is now, the holder is the taker
-- ($9), and no completion has landed; its deadline and reserved_at are one reading of
-- clock_timestamp() (a row sub-select); the new execution is not in doubt, so any mark of the
-- old one is cleared (store rule 6). The row is taken with
-- SKIP LOCKED: if another transaction holds it (the old
-- holder's completion being committed right now), this never waits; it reports the row busy and
-- the caller answers in flight (C5).
-- $1..$3 the record, $4 fingerprint, $5 new token, $6 lease in milliseconds, $7 previous token,
-- $8 previous state, $9 the holder. Returns one row: whether the row could be taken, whether
-- there is a row at all (one gone since the decision read it is a change, not a busy row), and
-- the new deadline if it was replaced.
WITH target AS (
    SELECT ctid FROM idem_records
    WHERE consumer = $1 AND route = $2 AND key = $3
    FOR UPDATE SKIP LOCKED
),
replaced AS (
    UPDATE idem_records
    SET fingerprint = $4, token = $5, state = 0, response = NULL,
        (deadline, reserved_at) = (
            SELECT clock.now + $6 * interval '1 millisecond', date_trunc('milliseconds', clock.now)
            FROM (SELECT clock_timestamp() AS now) AS clock
        ),
        completed_at = NULL, holder = $9::text, doubt = NULL, doubt_check_at = NULL
    WHERE ctid IN (SELECT ctid FROM target)
      AND token = $7 AND state = $8 AND deadline <= clock_timestamp()
    RETURNING deadline
)
SELECT EXISTS (SELECT 1 FROM target) AS taken,
       EXISTS (SELECT 1 FROM idem_records WHERE consumer = $1 AND route = $2 AND key = $3) AS present,
       (SELECT timestamptz_send(deadline) FROM replaced) AS deadline_at
