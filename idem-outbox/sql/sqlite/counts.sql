-- Pending (due now), delayed (due later or claimed) and dead deliveries.
SELECT
    coalesce(sum(state = 'pending' AND next_at <= ?1 AND claim_token IS NULL), 0),
    coalesce(sum(state = 'pending' AND (next_at > ?1 OR claim_token IS NOT NULL)), 0),
    coalesce(sum(state = 'dead'), 0)
FROM idem_outbox_deliveries
