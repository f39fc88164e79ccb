-- The endpoints $1 (a JSON array of names) answered a recorded attempt with a 2xx: no longer failing. Their rows are
-- locked in name order, as `record.sql` locks them, so the two never deadlock.
WITH recovered AS (
    SELECT name
    FROM idem_outbox_endpoints
    WHERE name IN (SELECT json_array_elements_text($1::json)) AND failing_since IS NOT NULL
    ORDER BY name
    FOR UPDATE
)
UPDATE idem_outbox_endpoints AS e
SET failing_since = NULL
FROM recovered AS r
WHERE e.name = r.name
