-- Fenced completion (C6): only the token holder of an in-progress record. With complete_in it
-- runs in the caller's transaction, so the effect and the completion commit together. The
-- retention runs from clock_timestamp(), the moment of this statement: inside a transaction,
-- now() is the transaction's start, which may be long before. completed_at (and a check time)
-- is that moment too, read again microseconds later, to the millisecond, for operators.
-- The row's filter first sets its transaction's lock_timeout (it runs on the row the scan
-- found, before the row is taken, and again on a newer version after a wait), so a row another
-- transaction holds is waited for at most that long (C13), whatever the session or the
-- caller's transaction said; once a row was found it stays set for the rest of the
-- transaction.
-- One plain UPDATE on the record's index: no sub-select and no one-time filter, whose plan
-- nodes PostgreSQL builds again at every execution (about 22 000 server instructions, a twentieth
-- of a fresh key's: docs/benchmarks.md, "What bounds each store").
-- The store writes its configured lock deadline in place of '3s' (the default).
-- The filter also sets its transaction's idle deadline (idle_in_transaction_session_timeout):
-- from here to its COMMIT the transaction holds the record's row, which a takeover skips, so a
-- caller that stops between the two (a frozen process, a half-open connection: a session the
-- server believes in) would keep every retry in flight for as long as it stays stopped; past
-- the deadline the server ends the session, the transaction rolls back and the orphan is taken
-- over after its lease (C9, C13). The store writes its configured idle deadline in place of
-- '30s' (the default).
-- The mark of an answer in doubt ($7, NULL for the execution's own answer) is written with it,
-- due for a check at the completion's moment; NULL clears any mark and its check time (store
-- rule 6).
-- In a transaction the store began for an effect ($8 true), the completion also needs that
-- transaction still open: its BEGIN made it DEFERRABLE (src/session.rs), which RESET ALL
-- leaves and any COMMIT or ROLLBACK ends, the effect's own too. After one, this
-- statement would run in the effect's next transaction or in autocommit, and commit the
-- completion apart from what the effect wrote: it changes nothing instead, and the store asks
-- why (effect_tx_open.sql).
-- $1..$3 the record, $4 token, $5 encoded response, $6 retention in milliseconds, $7 the mark
-- of doubt or NULL, $8 whether the store began this transaction for an effect.
UPDATE idem_records
SET state = 1, response = $5, doubt = $7::bytea,
    deadline = clock_timestamp() + $6 * interval '1 millisecond',
    completed_at = date_trunc('milliseconds', clock_timestamp()),
    doubt_check_at = CASE WHEN $7::bytea IS NOT NULL THEN date_trunc('milliseconds', clock_timestamp()) END
WHERE consumer = $1 AND route = $2 AND key = $3 AND token = $4 AND state = 0
  AND (NOT $8::boolean OR current_setting('transaction_deferrable') = 'on')
  AND set_config('lock_timeout', '3s', true) IS NOT NULL
  AND set_config('idle_in_transaction_session_timeout', '30s', true) IS NOT NULL
