-- One bounded batch of expired records (C10), found through the deadline index. Rows another
-- transaction holds (a completion being committed) are skipped, never waited for, so purge does
-- not block live traffic and live traffic does not block purge.
-- $1 the batch size.
DELETE FROM idem_records
WHERE ctid IN (
    SELECT ctid FROM idem_records
    WHERE deadline <= clock_timestamp()
    LIMIT $1
    FOR UPDATE SKIP LOCKED
)
