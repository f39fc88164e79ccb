-- One bounded batch of entries first received before ?1, oldest first, at most ?2; the
-- first_received index finds them.
DELETE FROM idem_records_inbox_audit
WHERE rowid IN (
    SELECT rowid FROM idem_records_inbox_audit
    WHERE first_received < ?1
    ORDER BY first_received
    LIMIT ?2
)
