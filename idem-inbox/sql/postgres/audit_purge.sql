-- One bounded batch of entries first received before $1, oldest first, at most $2, through the
-- first_received index. Rows another transaction holds (a delivery being counted) are skipped,
-- never waited for: the next batch takes them.
DELETE FROM idem_records_inbox_audit
WHERE ctid IN (
    SELECT ctid FROM idem_records_inbox_audit
    WHERE first_received < $1
    ORDER BY first_received
    LIMIT $2
    FOR UPDATE SKIP LOCKED
)
