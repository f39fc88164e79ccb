-- At most ?3 deliveries delivered before ?1 or dead before ?2 (ms).
DELETE FROM idem_outbox_deliveries
WHERE id IN (
    SELECT id FROM idem_outbox_deliveries
    WHERE (state = 'delivered' AND finished_at < ?1) OR (state = 'dead' AND finished_at < ?2)
    ORDER BY id
    LIMIT ?3
)
