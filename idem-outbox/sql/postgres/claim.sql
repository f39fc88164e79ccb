-- Claims up to $3 due deliveries of enabled endpoints for $2 ms under the token $1, skipping
-- those another dispatcher is claiming: a claim that runs out makes its delivery due again.
WITH due AS (
    SELECT d.id
    FROM idem_outbox_deliveries AS d
    JOIN idem_outbox_endpoints AS e ON e.name = d.endpoint
    WHERE d.state = 'pending' AND d.next_at <= now() AND e.enabled
    ORDER BY d.next_at
    LIMIT $3
    FOR UPDATE OF d SKIP LOCKED
)
UPDATE idem_outbox_deliveries AS d
SET claim_token = $1, next_at = now() + $2 * interval '1 millisecond', attempts = d.attempts + 1
FROM due
WHERE d.id = due.id
RETURNING d.id, d.message_id, d.endpoint, d.payload, d.content_type, d.headers, d.attempts
