-- Pending (due now), delayed (due later or claimed) and dead deliveries.
SELECT
    count(*) FILTER (WHERE state = 'pending' AND next_at <= now() AND claim_token IS NULL),
    count(*) FILTER (WHERE state = 'pending' AND (next_at > now() OR claim_token IS NOT NULL)),
    count(*) FILTER (WHERE state = 'dead')
FROM idem_outbox_deliveries
