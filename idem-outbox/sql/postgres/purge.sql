-- At most $3 deliveries delivered more than $1 ms ago or dead more than $2 ms ago, and their
-- attempts; rows another purge is deleting are skipped. A retention reaching back before the
-- epoch keeps everything (as on SQLite), never an interval or timestamp out of range.
WITH cutoff AS (
    SELECT now() - LEAST($1::bigint, epoch_ms) * interval '1 millisecond' AS delivered,
           now() - LEAST($2::bigint, epoch_ms) * interval '1 millisecond' AS dead
    FROM (SELECT (extract(epoch FROM now()) * 1000)::bigint AS epoch_ms) AS clock
), gone AS (
    DELETE FROM idem_outbox_deliveries
    WHERE id IN (
        SELECT id FROM idem_outbox_deliveries
        WHERE (state = 'delivered' AND finished_at < (SELECT delivered FROM cutoff))
           OR (state = 'dead' AND finished_at < (SELECT dead FROM cutoff))
        ORDER BY id
        LIMIT $3
        FOR UPDATE SKIP LOCKED
    )
    RETURNING id
), attempts AS (
    DELETE FROM idem_outbox_attempts WHERE delivery_id IN (SELECT id FROM gone)
)
SELECT count(*) FROM gone
