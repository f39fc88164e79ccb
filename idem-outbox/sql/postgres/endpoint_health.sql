-- $2: the attempt succeeded; otherwise the endpoint fails since its first failure, and is
-- disabled once that is $3 ms ago.
UPDATE idem_outbox_endpoints
SET failing_since = CASE WHEN $2 THEN NULL ELSE coalesce(failing_since, now()) END,
    enabled = CASE WHEN NOT $2 AND coalesce(failing_since, now()) <= now() - $3 * interval '1 millisecond'
                   THEN false ELSE enabled END
WHERE name = $1
