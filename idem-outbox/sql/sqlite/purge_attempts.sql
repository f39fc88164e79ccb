-- The attempts of the deliveries purge_deliveries.sql deletes next, in the same transaction.
DELETE FROM idem_outbox_attempts
WHERE delivery_id IN (
    SELECT id FROM idem_outbox_deliveries
    WHERE (state = 'delivered' AND finished_at < ?1) OR (state = 'dead' AND finished_at < ?2)
    ORDER BY id
    LIMIT ?3
)
