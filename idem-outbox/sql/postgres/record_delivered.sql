-- `record.sql` for attempts that all delivered (a 2xx, due again at once: never), without the
-- endpoints' health: a success changes an endpoint only when it was failing, which is rare, so
-- each recorded delivery comes back with whether its endpoint is failing, and the dispatcher
-- then clears it (`endpoint_recovered.sql`). Each delivery only under the claim that made it.
-- In arrays of one length: $1 the delivery, $2 its claim's token, $3 the status, $4 the
-- error, $5 the attempt's duration (ms), $6 the response's first KiB, $7 how many ms ago the
-- attempt started.
WITH attempt AS (
    SELECT *
    FROM unnest($1::bigint[], $2::text[], $3::integer[], $4::text[], $5::bigint[], $6::bytea[],
                $7::bigint[])
        AS a(id, token, status, error, duration_ms, response, started_ago_ms)
), recorded AS (
    UPDATE idem_outbox_deliveries AS d
    SET state = 'delivered', next_at = now(), claim_token = NULL, claimed_until = NULL,
        last_status = a.status, last_error = a.error, finished_at = now()
    FROM attempt AS a
    WHERE d.id = a.id AND d.claim_token = a.token
    RETURNING d.id, d.attempts, d.endpoint, a.status, a.error, a.duration_ms, a.response,
              a.started_ago_ms
), attempts AS (
    INSERT INTO idem_outbox_attempts (delivery_id, attempt, started_at, duration_ms, status, error, response)
    SELECT id, attempts, now() - started_ago_ms * interval '1 millisecond', duration_ms, status, error, response
    FROM recorded
)
SELECT r.id, e.failing_since IS NOT NULL AS failing
FROM recorded AS r
LEFT JOIN idem_outbox_endpoints AS e ON e.name = r.endpoint
