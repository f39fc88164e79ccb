-- One bounded batch of expired records (C10), found through the deadline index: the moment is
-- computed once, `(SELECT clock_timestamp())`, so the planner can use the index (a volatile
-- function compared row by row would scan the table). Rows another transaction holds (a
-- completion being committed, a takeover) are skipped, never waited for, so purge does not
-- block live traffic and live traffic does not block purge. Expired audit entries follow, with
-- what is left of the batch (reconciliations_purge.sql).
-- $1 the batch size.
DELETE FROM idem_records
WHERE ctid IN (
    SELECT ctid FROM idem_records
    WHERE deadline <= (SELECT clock_timestamp())
    ORDER BY deadline
    LIMIT $1
    FOR UPDATE SKIP LOCKED
)
