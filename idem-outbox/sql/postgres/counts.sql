-- Pending (due now), delayed (due later, claimed or set aside) and dead deliveries.
SELECT
    count(*) FILTER (WHERE state = 'pending' AND next_at <= now()
                       AND (claimed_until IS NULL OR claimed_until <= now())),
    count(*) FILTER (WHERE state = 'pending' AND (next_at > now() OR claimed_until > now())),
    count(*) FILTER (WHERE state = 'dead')
FROM idem_outbox_deliveries
