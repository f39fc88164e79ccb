-- One delivery per named endpoint, in the caller's transaction, and none unless every named
-- endpoint is registered ($5: a JSON array of distinct names); the dispatchers listening on $6
-- are woken when the transaction commits (a notification is sent only then).
WITH inserted AS (
    INSERT INTO idem_outbox_deliveries
        (message_id, endpoint, payload, content_type, headers, created_at, state, next_at, attempts)
    SELECT $1, e.name, $2, $3, $4, now(), 'pending', now(), 0
    FROM idem_outbox_endpoints AS e
    WHERE e.name IN (SELECT json_array_elements_text($5::json))
      AND (SELECT count(*) FROM idem_outbox_endpoints
           WHERE name IN (SELECT json_array_elements_text($5::json))) = json_array_length($5::json)
    RETURNING 1
)
SELECT count(*) AS deliveries
FROM inserted CROSS JOIN LATERAL (SELECT pg_notify($6, '')) AS woken
