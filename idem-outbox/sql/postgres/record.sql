-- Records the ends of several attempts, their attempts and their endpoints' health in one
-- statement, each only under the claim that made it (a stale claim changes nothing, the
-- others are recorded all the same). $1 is a JSON array with one object per attempt: `id` the
-- delivery, `token` its claim's token, `state` the new state, `delay_ms` ms until it is due
-- again, `status`, `error`, `duration_ms` the attempt's duration, `response` the response's
-- first KiB in hex, `disable_after_ms` after how many ms of failing the endpoint is disabled,
-- `started_ago_ms` how many ms ago the attempt started. Returns the deliveries recorded.
WITH attempt AS (
    SELECT *
    FROM json_to_recordset($1::json)
        AS a(id bigint, token text, state text, delay_ms bigint, status integer, error text,
             duration_ms bigint, response text, disable_after_ms bigint, started_ago_ms bigint)
), recorded AS (
    UPDATE idem_outbox_deliveries AS d
    SET state = a.state, next_at = now() + a.delay_ms * interval '1 millisecond',
        claim_token = NULL, claimed_until = NULL,
        last_status = a.status, last_error = a.error,
        finished_at = CASE WHEN a.state = 'pending' THEN NULL ELSE now() END
    FROM attempt AS a
    WHERE d.id = a.id AND d.claim_token = a.token
    RETURNING d.id, d.attempts, d.endpoint, a.state, a.status, a.error, a.duration_ms,
              decode(a.response, 'hex') AS response, a.disable_after_ms, a.started_ago_ms
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
