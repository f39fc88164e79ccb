-- Records an attempt's end and the attempt, only under the claim that made it (a stale claim
-- changes nothing): $3 the new state, $4 ms until it is due again, $7 the attempt's duration.
WITH recorded AS (
    UPDATE idem_outbox_deliveries
    SET state = $3, next_at = now() + $4 * interval '1 millisecond', claim_token = NULL,
        last_status = $5, last_error = $6,
        finished_at = CASE WHEN $3 = 'pending' THEN NULL ELSE now() END
    WHERE id = $1 AND claim_token = $2
    RETURNING id, attempts
)
INSERT INTO idem_outbox_attempts (delivery_id, attempt, started_at, duration_ms, status, error, response)
SELECT id, attempts, now() - $7 * interval '1 millisecond', $7, $5, $6, $8 FROM recorded
