-- At most $3 deliveries delivered more than $1 ms ago or dead more than $2 ms ago, and their
-- attempts; rows another purge is deleting are skipped.
WITH gone AS (
    DELETE FROM idem_outbox_deliveries
    WHERE id IN (
        SELECT id FROM idem_outbox_deliveries
        WHERE (state = 'delivered' AND finished_at < now() - $1 * interval '1 millisecond')
           OR (state = 'dead' AND finished_at < now() - $2 * interval '1 millisecond')
        ORDER BY id
        LIMIT $3
        FOR UPDATE SKIP LOCKED
    )
    RETURNING id
), attempts AS (
    DELETE FROM idem_outbox_attempts WHERE delivery_id IN (SELECT id FROM gone)
)
SELECT count(*) FROM gone
