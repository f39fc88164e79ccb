-- One delivery per named endpoint, in the caller's transaction, and none unless every named
-- endpoint is registered ($5: distinct names); the dispatchers listening on $6 are woken when
-- the transaction commits (a notification is sent only then).
WITH inserted AS (
    INSERT INTO idem_outbox_deliveries
        (message_id, endpoint, payload, content_type, headers, created_at, state, next_at, attempts)
    SELECT $1, e.name, $2, $3, $4, now(), 'pending', now(), 0
    FROM idem_outbox_endpoints AS e
    WHERE e.name = ANY($5)
      AND (SELECT count(*) FROM idem_outbox_endpoints WHERE name = ANY($5)) = cardinality($5)
    RETURNING 1
)
SELECT count(*) AS deliveries
FROM inserted CROSS JOIN LATERAL (SELECT pg_notify($6, '')) AS woken
