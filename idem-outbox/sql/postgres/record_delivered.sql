-- `record.sql` for attempts that all delivered (a 2xx, due again at once: never), without the
-- endpoints' health: a success changes an endpoint only when it was failing, which is rare, so
-- each recorded delivery comes back with whether its endpoint is failing, and the dispatcher
-- then clears it (`endpoint_recovered.sql`). Each delivery only under the claim that made it.
-- $1 is a JSON array with one object per attempt: `id` the delivery, `token` its claim's
-- token, `status`, `error`, `duration_ms` the attempt's duration, `response` the response's
-- first KiB in hex, `started_ago_ms` how many ms ago the attempt started.
WITH attempt AS (
    SELECT *
    FROM json_to_recordset($1::json)
        AS a(id bigint, token text, status integer, error text, duration_ms bigint, response text,
             started_ago_ms bigint)
), recorded AS (
    UPDATE idem_outbox_deliveries AS d
    SET state = 'delivered', next_at = now(), claim_token = NULL, claimed_until = NULL,
        last_status = a.status, last_error = a.error, finished_at = now()
    FROM attempt AS a
    WHERE d.id = a.id AND d.claim_token = a.token
    RETURNING d.id, d.attempts, d.endpoint, a.status, a.error, a.duration_ms,
              decode(a.response, 'hex') AS response, a.started_ago_ms
), attempts AS (
    INSERT INTO idem_outbox_attempts (delivery_id, attempt, started_at, duration_ms, status, error, response)
    SELECT id, attempts, now() - started_ago_ms * interval '1 millisecond', duration_ms, status, error, response
    FROM recorded
)
SELECT r.id, e.failing_since IS NOT NULL AS failing
FROM recorded AS r
LEFT JOIN idem_outbox_endpoints AS e ON e.name = r.endpoint
