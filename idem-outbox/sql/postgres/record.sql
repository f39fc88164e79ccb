-- Records the ends of several attempts, their attempts and their endpoints' health in one
-- statement, each only under the claim that made it (a stale claim changes nothing, the
-- others are recorded all the same). One row per attempt, in arrays of one length: $1 the
-- delivery, $2 its claim's token, $3 the new state, $4 ms until it is due again, $5 the
-- status, $6 the error, $7 the attempt's duration (ms), $8 the response's first KiB, $9 after
-- how many ms of failing the endpoint is disabled, $10 how many ms ago the attempt started.
-- Returns the deliveries recorded.
WITH attempt AS (
    SELECT *
    FROM unnest($1::bigint[], $2::text[], $3::text[], $4::bigint[], $5::integer[], $6::text[],
                $7::bigint[], $8::bytea[], $9::bigint[], $10::bigint[])
        AS a(id, token, state, delay_ms, status, error, duration_ms, response, disable_after_ms,
             started_ago_ms)
), recorded AS (
    UPDATE idem_outbox_deliveries AS d
    SET state = a.state, next_at = now() + a.delay_ms * interval '1 millisecond',
        claim_token = NULL, claimed_until = NULL,
        last_status = a.status, last_error = a.error,
        finished_at = CASE WHEN a.state = 'pending' THEN NULL ELSE now() END
    FROM attempt AS a
    WHERE d.id = a.id AND d.claim_token = a.token
    RETURNING d.id, d.attempts, d.endpoint, a.state, a.status, a.error, a.duration_ms,
              a.response, a.disable_after_ms, a.started_ago_ms
), outcome AS (
    -- Per endpoint: whether one of its recorded attempts succeeded (the attempts of one
    -- statement ran at once: a success among them means the endpoint answers).
    SELECT endpoint, bool_or(state = 'delivered') AS ok, min(disable_after_ms) AS disable_after_ms
    FROM recorded
    GROUP BY endpoint
), changing AS (
    -- The endpoints whose health changes (a success changes one only when it was failing),
    -- locked in name order, so two dispatchers recording at once never deadlock on them.
    SELECT e.name, o.ok, o.disable_after_ms
    FROM idem_outbox_endpoints AS e
    JOIN outcome AS o ON o.endpoint = e.name
    WHERE NOT o.ok OR e.failing_since IS NOT NULL
    ORDER BY e.name
    FOR UPDATE OF e
), health AS (
    UPDATE idem_outbox_endpoints AS e
    SET failing_since = CASE WHEN c.ok THEN NULL ELSE coalesce(e.failing_since, now()) END,
        enabled = CASE WHEN NOT c.ok
                        AND coalesce(e.failing_since, now()) <= now() - c.disable_after_ms * interval '1 millisecond'
                       THEN false ELSE e.enabled END
    FROM changing AS c
    WHERE e.name = c.name
), attempts AS (
    INSERT INTO idem_outbox_attempts (delivery_id, attempt, started_at, duration_ms, status, error, response)
    SELECT id, attempts, now() - started_ago_ms * interval '1 millisecond', duration_ms, status, error, response
    FROM recorded
)
SELECT id FROM recorded
