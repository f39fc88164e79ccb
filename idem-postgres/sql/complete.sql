-- Fenced completion (C6): only the token holder of an in-progress record. With complete_in it
-- runs in the caller's transaction, so the effect and the completion commit together. The
-- retention runs from clock_timestamp(), the moment of this statement: inside a transaction,
-- now() is the transaction's start, which may be long before. completed_at is the same moment,
-- for operators: clock_timestamp() is read once per row (a row sub-select), after the row is
-- taken.
-- The statement first sets its transaction's lock_timeout (the one-time filter runs before the
-- row is taken), so a row another transaction holds is waited for at most that long (C13),
-- whatever the session or the caller's transaction said; it stays set for the rest of the
-- transaction.
-- The store writes its configured lock deadline in place of '3s' (the default).
-- The mark of an answer in doubt ($7, NULL for the execution's own answer) is written with it,
-- due for a check at the completion's moment; NULL clears any mark and its check time (store
-- rule 6).
-- $1..$3 the record, $4 token, $5 encoded response, $6 retention in milliseconds, $7 the mark
-- of doubt or NULL.
UPDATE idem_records
SET state = 1, response = $5, doubt = $7::bytea,
    (deadline, completed_at, doubt_check_at) = (
        SELECT clock.now + $6 * interval '1 millisecond', date_trunc('milliseconds', clock.now),
               CASE WHEN $7::bytea IS NOT NULL THEN date_trunc('milliseconds', clock.now) END
        FROM (SELECT clock_timestamp() AS now) AS clock
    )
WHERE consumer = $1 AND route = $2 AND key = $3 AND token = $4 AND state = 0
  AND (SELECT set_config('lock_timeout', '3s', true)) IS NOT NULL
