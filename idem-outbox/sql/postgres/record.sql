-- Records an attempt's end, the attempt, and its endpoint's health, only under the claim that
-- made it (a stale claim changes nothing), in one round trip: $3 the new state, $4 ms until it
-- is due again, $7 the attempt's duration, $9 whether it succeeded, $10 after how many ms of
-- failing the endpoint is disabled.
WITH recorded AS (
    UPDATE idem_outbox_deliveries
    SET state = $3, next_at = now() + $4 * interval '1 millisecond', claim_token = NULL,
        claimed_until = NULL,
        last_status = $5, last_error = $6,
        finished_at = CASE WHEN $3 = 'pending' THEN NULL ELSE now() END
    WHERE id = $1 AND claim_token = $2
    RETURNING id, attempts, endpoint
), health AS (
    -- A success changes the endpoint only when it was failing.
    UPDATE idem_outbox_endpoints
    SET failing_since = CASE WHEN $9 THEN NULL ELSE coalesce(failing_since, now()) END,
        enabled = CASE WHEN NOT $9 AND coalesce(failing_since, now()) <= now() - $10 * interval '1 millisecond'
                       THEN false ELSE enabled END
    WHERE name = (SELECT endpoint FROM recorded) AND (NOT $9 OR failing_since IS NOT NULL)
)
INSERT INTO idem_outbox_attempts (delivery_id, attempt, started_at, duration_ms, status, error, response)
SELECT id, attempts, now() - $7 * interval '1 millisecond', $7, $5, $6, $8 FROM recorded
