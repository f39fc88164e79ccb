-- One bounded batch of expired records (C10): among the 4 x $1 oldest records by reservation
-- time (an index scan of idem_records_reserved, stopped there), the expired ones, at most $1.
-- No index on the deadline: the completion changes it, and must stay a HOT update (migration
-- 5). With one retention, records expire about in the order they were reserved, so the oldest
-- are the expired ones; a record kept longer than those reserved after it (a longer retention,
-- a renewed lease) holds back the purge of the ones behind it, once it fills the window,
-- until it expires itself (they behave as absent meanwhile). The moment is computed once,
-- `(SELECT clock_timestamp())`. Rows another transaction holds (a completion being committed,
-- a takeover) are skipped, never waited for, so purge does not block live traffic and live
-- traffic does not block purge. Expired audit entries follow, with what is left of the batch
-- (reconciliations_purge.sql).
-- $1 the batch size.
DELETE FROM idem_records
WHERE ctid IN (
    SELECT ctid FROM idem_records
    WHERE ctid = ANY (ARRAY(
              SELECT ctid FROM idem_records
              ORDER BY reserved_at, consumer, route, key
              LIMIT 4 * $1
          ))
      AND deadline <= (SELECT clock_timestamp())
    LIMIT $1
    FOR UPDATE SKIP LOCKED
)
