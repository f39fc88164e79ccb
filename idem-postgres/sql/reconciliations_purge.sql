-- One bounded batch of expired audit entries (store rules 4 and 7), found through the
-- idem_records_trail_kept index like purge_expired.sql's records: the moment is computed once,
-- and rows another transaction holds are skipped, never waited for.
-- $1 the batch size.
DELETE FROM idem_records_reconciliations
WHERE ctid IN (
    SELECT ctid FROM idem_records_reconciliations
    WHERE kept_until <= (SELECT clock_timestamp())
    ORDER BY kept_until
    LIMIT $1
    FOR UPDATE SKIP LOCKED
)
